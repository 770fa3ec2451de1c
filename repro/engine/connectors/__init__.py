"""KV connectors shipped with the kit (child side: these import torch and vllm)."""
