"""One node agent per node (torchrun rank): ``agent`` (its servers and trainer ranks, and
``RemoteEngine``, the controller's side), ``wire`` (the wire format), ``trainer_client`` (trainer
ranks as node-agent children), ``watch`` (rank 0's health watch of every agent)."""
