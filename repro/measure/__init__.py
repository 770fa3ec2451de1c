"""Measurements that are not verdicts: the CPU acceptance's timing, the model's logit margins."""
