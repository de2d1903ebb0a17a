"""The RL run: a small GRPO-style trainer that learns through the fleet.

This is the project's proof and its main demo. The trainer is a user of the fleet, as any
RL framework's trainer is: it samples through the gateway (tokens in, token ids and the
engine's logprobs out, each answer with the weight versions that produced its tokens),
trains in plain torch on the same tiny Llama the engines serve, and pushes its weights to
every engine each step through the controller (by broadcast with vLLM's own trainer-side
weight-transfer engine, or from disk). After every sync it checks that the engines sample
with its weights: the engine's logprob of each sampled token against its own.

- `task`: the prompts and the reward (pure);
- `policy`: the model, token logprobs, advantages and the clipped policy-gradient loss (torch);
- `sampling`: rollouts through the gateway (HTTP);
- `sync`: weights to the fleet, by broadcast or disk, through the controller (HTTP, gloo);
- `loop`: the synchronous and asynchronous runs, one record per step;
- `report`: the step line, the JSONL log and the plot;
- `__main__`: `python -m rlcp.rl`, pointed at a running controller and gateway.
"""
