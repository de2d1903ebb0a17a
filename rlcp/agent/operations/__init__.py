"""The agent's operations, one module per family, each over an `AgentContext`
(`rlcp/agent/context.py`) and the engine as the one capability it uses:

    control.py   pause / resume / abort, and prepare (told the desired version, then paused)
    disk.py      check a checkpoint directory; reload every weight from it
    update.py    a controller's whole disk update in one call (over control, disk, weights)
    weights.py   name the weights; checksums and the checker
    transfer.py  vLLM's weight-transfer protocol, its order checked (`TransferState`)
    lora.py      load / hot-swap / unload adapters (`LoraRegistry`)

Each holds the state of its own family; the admin routes call them.
"""
