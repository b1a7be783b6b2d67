"""What `lemur-eval serve` accepts and answers: OpenAI's request bodies checked into typed
requests, and its response shapes (lemur.eval.serve runs them).

`/v1/completions` takes OpenAI's legacy completions body: `prompt` (a string, a list of
strings, a list of token ids or a list of such lists), `max_tokens` (default 16),
`temperature` (default 1), `top_p`, `n`, `stop` (a string or up to 4), `seed`, `echo`,
`logprobs` (0 to 5), plus vLLM's `top_k`. `/v1/chat/completions` takes `messages`
({role, content} with string content) and the same sampling fields (`max_tokens` or
`max_completion_tokens`). Fields OpenAI defines but we do not implement are accepted only
at their no-op value (`stream: false`, `presence_penalty: 0`, ...); any other field is a
400 naming it, so a request never silently means something else here.

Every mistake is an `ApiError`: an HTTP status and one line, answered as OpenAI does,
`{"error": {"message": ..., "type": "invalid_request_error", ...}}`.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

# OpenAI's limits on these fields (its API refuses beyond them; so do we).
MAX_STOPS = 4
MAX_LOGPROBS = 5
MAX_TEMPERATURE = 2.0
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

# Fields OpenAI defines that change nothing at these values: accepted, ignored.
NO_OP_FIELDS: dict[str, tuple[Any, ...]] = {
    "stream": (False, None),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "logit_bias": (None, {}),
    "suffix": (None,),
    "user": (),  # any value: a caller's label
    "best_of": (None, 1),
    "stream_options": (None,),
}
SAMPLING_FIELDS = ("model", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed")
COMPLETION_FIELDS = frozenset({*SAMPLING_FIELDS, "prompt", "echo", "logprobs"})
CHAT_FIELDS = frozenset({*SAMPLING_FIELDS, "messages", "max_completion_tokens", "logprobs"})
CHAT_ROLES = ("system", "user", "assistant", "tool")


class ApiError(Exception):
    """A request the server refuses: the HTTP status, one line, and OpenAI's error type."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {"error": {"message": str(self), "type": self.kind, "param": None, "code": None}}


def bad(message: str) -> ApiError:
    """A 400: the request itself is wrong."""
    return ApiError(400, message)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask: the model's context, the longest prompt, the most new
    tokens of one choice and the most rows (prompts x n) a request may hold."""

    context: int
    max_prompt_tokens: int
    max_tokens: int
    max_rows: int


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a request's choices are sampled (the same for each of its rows)."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """A checked `/v1/completions` body: prompts as given (text or token ids)."""

    prompts: tuple[str | tuple[int, ...], ...]
    n: int
    settings: Settings
    echo: bool
    logprobs: int | None
    model: str | None


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked `/v1/chat/completions` body."""

    messages: tuple[Mapping[str, str], ...]
    n: int
    settings: Settings
    model: str | None


def _is_int(value: Any) -> bool:
    """A JSON integer (not a boolean, which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    """A number field in [low, high]."""
    value = body.get(name, default)
    if value is None:
        return default
    if not (_is_int(value) or isinstance(value, float)) or not math.isfinite(value):
        raise bad(f"{name} must be a number, got {value!r}")
    if not low <= value <= high:
        raise bad(f"{name} must be between {low:g} and {high:g}, got {value!r}")
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    """An integer field in [low, high]."""
    value = body.get(name, default)
    if value is None:
        return default
    if not _is_int(value):
        raise bad(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise bad(f"{name} must be between {low} and {high}, got {value}")
    return int(value)


def check_fields(body: Any, allowed: frozenset[str]) -> Mapping[str, Any]:
    """The body as an object whose every field is one we implement or a no-op value."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    for name, value in body.items():
        if name in allowed:
            continue
        if name not in NO_OP_FIELDS:
            raise bad(f"unknown field {name!r}")
        if NO_OP_FIELDS[name] and value not in NO_OP_FIELDS[name]:
            raise bad(f"{name}={value!r} is not supported (only {NO_OP_FIELDS[name][0]!r})")
    return body


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    """`stop`: null, a string or a list of up to MAX_STOPS non-empty strings."""
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop must be a non-empty string or a list of them")
    if len(stops) > MAX_STOPS:
        raise bad(f"stop holds {len(stops)} strings, at most {MAX_STOPS}")
    return tuple(stops)


def settings(body: Mapping[str, Any], limits: Limits, max_tokens_field: str) -> Settings:
    """The sampling fields of a body (n is the caller's: it bounds rows, not sampling)."""
    max_tokens = _integer(body, max_tokens_field, DEFAULT_MAX_TOKENS, 0, 2**31)
    if max_tokens > limits.max_tokens:
        raise bad(
            f"{max_tokens_field} {max_tokens} is over this server's --max-tokens "
            f"{limits.max_tokens}"
        )
    return Settings(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, MAX_TEMPERATURE),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0) or 1.0,  # OpenAI takes 0; it means 1 here
        top_k=max(0, _integer(body, "top_k", 0, -1, 2**31)),  # vLLM's: -1 and 0 are off
        stop=_stop(body),
        seed=_integer(body, "seed", 0, -(2**63), 2**63 - 1),
    )


def _rows(body: Mapping[str, Any], count: int, limits: Limits) -> int:
    """`n`, with prompts x n within the server's --max-queue."""
    n = _integer(body, "n", 1, 1, 2**63)
    if count * n > limits.max_rows:
        raise bad(
            f"{count} prompts x n {n} = {count * n} choices, over this server's "
            f"--max-queue {limits.max_rows}"
        )
    return n


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    """`prompt` as OpenAI allows it: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        return (prompt,)
    if not isinstance(prompt, list) or not prompt:
        raise bad("prompt must be a string, a list of strings or a list of token id lists")
    if all(_is_int(t) for t in prompt):
        return (tuple(prompt),)
    out: list[str | tuple[int, ...]] = []
    for p in prompt:
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, list) and p and all(_is_int(t) for t in p):
            out.append(tuple(p))
        else:
            raise bad("each prompt must be a string or a non-empty list of token ids")
    return tuple(out)


def completion_request(body: Any, limits: Limits) -> CompletionRequest:
    """A `/v1/completions` body checked (ApiError 400 on the first thing wrong)."""
    body = check_fields(body, COMPLETION_FIELDS)
    if "prompt" not in body:
        raise bad("prompt is required")
    prompts = _prompts(body["prompt"])
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise bad(f"echo must be true or false, got {echo!r}")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _integer(body, "logprobs", 0, 0, MAX_LOGPROBS)
    made = settings(body, limits, "max_tokens")
    if made.max_tokens == 0 and not echo:
        raise bad("max_tokens 0 asks for nothing: give echo true to score the prompt")
    model = body.get("model")
    return CompletionRequest(
        prompts,
        _rows(body, len(prompts), limits),
        made,
        echo,
        logprobs,
        model if isinstance(model, str) else None,
    )


def _message(m: Any) -> Mapping[str, str]:
    """One chat message: a known role and string content."""
    if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
        raise bad(f"each message needs a role among {', '.join(CHAT_ROLES)}")
    content = m.get("content")
    if not isinstance(content, str):
        raise bad("each message's content must be a string (no content parts)")
    return {"role": m["role"], "content": content}


def chat_request(body: Any, limits: Limits) -> ChatRequest:
    """A `/v1/chat/completions` body checked (ApiError 400 on the first thing wrong)."""
    body = check_fields(body, CHAT_FIELDS)
    if body.get("logprobs") not in (None, False):
        raise bad("logprobs is not supported on chat completions (use /v1/completions)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list")
    field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    made = settings(body, limits, field)
    if made.max_tokens == 0:
        raise bad(f"{field} must be at least 1")
    model = body.get("model")
    return ChatRequest(
        tuple(_message(m) for m in messages),
        _rows(body, 1, limits),
        made,
        model if isinstance(model, str) else None,
    )


def check_length(prompt_tokens: int, max_tokens: int, limits: Limits) -> None:
    """A 400 when the prompt, or the prompt and its new tokens, do not fit (never cut)."""
    if prompt_tokens == 0:
        raise bad("a prompt has no tokens")
    if prompt_tokens + max_tokens > limits.context:
        raise bad(
            f"this model's maximum context length is {limits.context} tokens; a prompt of "
            f"{prompt_tokens} tokens and max_tokens {max_tokens} make {prompt_tokens + max_tokens}"
        )
    if prompt_tokens > limits.max_prompt_tokens:
        raise bad(
            f"a prompt of {prompt_tokens} tokens is over this server's --max-prompt-tokens "
            f"{limits.max_prompt_tokens}"
        )


FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # ours -> OpenAI's


def response(kind: str, model: str, choices: list[dict[str, Any]], usage: tuple[int, int]) -> dict:
    """A completion response around its choices; `usage` is (prompt, completion) tokens."""
    prefix, obj = ("cmpl", "text_completion") if kind == "text" else ("chatcmpl", "chat.completion")
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        },
    }


def text_choice(index: int, text: str, finish: str, logprobs: dict | None) -> dict[str, Any]:
    """One `/v1/completions` choice."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": FINISH[finish]}


def chat_choice(index: int, text: str, finish: str) -> dict[str, Any]:
    """One `/v1/chat/completions` choice."""
    message = {"role": "assistant", "content": text}
    return {"index": index, "message": message, "logprobs": None, "finish_reason": FINISH[finish]}


def logprobs_object(
    pieces: Sequence[str],
    offsets: Sequence[int],
    token_logprobs: Sequence[float | None],
    top: Sequence[dict[str, float] | None],
) -> dict[str, Any]:
    """OpenAI's legacy `logprobs`: each token's text, its logprob given the ones before (None
    for a first token, which has no context), the most likely tokens there and its offset in
    the choice's text."""
    return {
        "tokens": list(pieces),
        "token_logprobs": list(token_logprobs),
        "top_logprobs": list(top),
        "text_offset": list(offsets),
    }


def models_list(name: str, created: int) -> dict[str, Any]:
    """`/v1/models`: the one model this server runs."""
    model = {"id": name, "object": "model", "created": created, "owned_by": "lemur"}
    return {"object": "list", "data": [model]}
