"""Executing a run: its workspace, the arms and their trials and confirmations, the scenarios' runs, engine
children and MP servers, the arm scheduler, load neighbours, the clock, disk watch, the KV comparison child."""
