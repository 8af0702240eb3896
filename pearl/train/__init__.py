"""The trainer: asynchronous GRPO on torch.distributed rank processes (docs/training.md).

``grpo`` (maths) and ``batch`` (records -> tensors) are pure; ``trainer`` is one rank process;
``client.TrainerClient`` is what the asyncio controller holds; ``broadcast`` moves weights to the
inference servers.
"""
