"""The inference routes of the workers' vLLM (0.32's OpenAI-compatible server: its OpenAI,
Anthropic, Cohere, pooling, tokenizer and scale-out routers), and what the gateway does with
each: forward it to a member inside the fence, or answer 501 saying why it cannot.

The controller never imports vLLM, so the list is written here; tests/controlplane/api/test_vllm_routes.py
reads vLLM's own routers and fails when vLLM serves an inference route this table does not
name. A path in neither table is a 404 naming it. Which of these a worker serves depends on
its model and flags (pooling routes on a pooling model, `/inference/v1/generate` with
`--enable-scale-out`): a worker that does not serve one answers its own 404, passed through.
"""

from __future__ import annotations

# (path, what it is): POST, a JSON object body, forwarded unchanged inside the fence.
FORWARDED: tuple[tuple[str, str], ...] = (
    ("/v1/completions", "OpenAI completions (streaming or not)"),
    ("/v1/chat/completions", "OpenAI chat completions (streaming or not)"),
    ("/v1/chat/completions/batch", "vLLM's batch of chat completions"),
    ("/v1/responses", "OpenAI responses (a stored response stays on the worker that made it: send `store: false`)"),
    ("/v1/messages", "Anthropic messages"),
    ("/v1/messages/count_tokens", "Anthropic token count"),
    ("/cohere/v2/chat", "Cohere chat"),
    ("/inference/v1/generate", "vLLM's tokens-in/tokens-out generate"),
    ("/v1/completions/render", "the prompt a completion would run, rendered to tokens"),
    ("/v1/chat/completions/render", "the prompt a chat completion would run, rendered to tokens"),
    ("/v1/messages/render", "the prompt an Anthropic message would run, rendered to tokens"),
    ("/v1/responses/render", "the prompt a response would run, rendered to tokens"),
    ("/cohere/v2/chat/render", "the prompt a Cohere chat would run, rendered to tokens"),
    ("/v1/completions/derender", "tokens back to a completion"),
    ("/v1/chat/completions/derender", "tokens back to a chat message"),
    ("/tokenize", "tokenize"),
    ("/detokenize", "detokenize"),
    ("/v1/embeddings", "OpenAI embeddings (a pooling model)"),
    ("/v2/embed", "Cohere embed (a pooling model)"),
    ("/pooling", "pooling (a pooling model)"),
    ("/classify", "classification (a pooling model)"),
    ("/score", "scoring (a pooling model)"),
    ("/v1/score", "scoring (a pooling model)"),
    ("/rerank", "rerank (a pooling model)"),
    ("/v1/rerank", "rerank (a pooling model)"),
    ("/v2/rerank", "rerank (a pooling model)"),
    ("/generative_scoring", "generative scoring"),
    ("/v1/systemone", "structured decisions"),
    ("/invocations", "SageMaker's invocation route (dispatched by the body's shape)"),
)

# Other engines' own inference routes the gateway forwards the same way (a member whose engine
# does not serve one answers its own 404, passed through).
OTHER_ENGINES_FORWARDED: tuple[tuple[str, str], ...] = (
    (
        "/generate",
        "SGLang's native generate (text or input_ids in; output ids and meta_info with the weight version spans out)",
    ),
)

_ONE_WORKER = (
    "request ids and stored responses live on the one worker that served them, and the gateway keeps no map of them"
)
# (method, path, why and what instead): served by vLLM, answered 501 by the gateway.
REFUSED: tuple[tuple[str, str, str], ...] = (
    ("GET", "/v1/responses/{response_id}", f"{_ONE_WORKER}; send `store: false` and keep the answer"),
    (
        "POST",
        "/v1/responses/{response_id}/cancel",
        f"{_ONE_WORKER}; close the connection of a streamed response (the gateway cancels the worker's request)",
    ),
    (
        "POST",
        "/inference/v1/abort_requests",
        f"{_ONE_WORKER}; close the connection (the gateway cancels the worker's "
        "request), or abort everything: the controller's POST /pause?mode=abort",
    ),
    (
        "POST",
        "/abort_requests",
        f"{_ONE_WORKER}; close the connection (the gateway cancels the worker's request), or "
        "abort everything: the controller's POST /pause?mode=abort",
    ),
    (
        "GET",
        "/v1/realtime",
        "speech-to-text's realtime websocket is not proxied; the gateway forwards JSON requests: "
        "connect to a worker's own server",
    ),
    (
        "POST",
        "/v1/audio/transcriptions",
        "speech-to-text takes multipart uploads; the gateway forwards JSON bodies "
        "(the fence reads them): send audio to a worker's own server",
    ),
    (
        "POST",
        "/v1/audio/translations",
        "speech-to-text takes multipart uploads; the gateway forwards JSON bodies "
        "(the fence reads them): send audio to a worker's own server",
    ),
)
