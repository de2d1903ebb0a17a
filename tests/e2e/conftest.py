"""Whole systems as users run them: real vLLM CPU engines (and Dynamo's own worker) through the
controller and the gateway (those tests carry the `vllm` marker), and the one-command local fleet
on SimEngine. The shared engines (`vllm_agent`, `vllm_agent_b`), the tiny models and
`references` are the whole suite's (tests/conftest.py): one engine a session, whichever folder
asks first."""
