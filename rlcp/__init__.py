"""rl-controlplane: the controller, the agent, the client and the harness, under one name."""
