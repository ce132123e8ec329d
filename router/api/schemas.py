"""OpenAI request bodies (the subset we serve) as pydantic models.

Nothing is silently ignored. Every parameter is honoured, or has nothing to honour (bookkeeping:
`user`, `metadata`, `service_tier`, ...: `NO_EFFECT`), or is rejected with a 400 that names it by
`check_supported`: parameters we cannot honour (`best_of > 1`, legacy `functions`, token-id prompts, presence and
frequency penalties other than 0, `logit_bias`, `top_k`, ...) and parameters the OpenAI schema does
not have (as OpenAI does: "unrecognized request argument").

`n` (at most `MAX_N`) is served by one worker call per choice, choice i seeded with `seed + i` when
a seed is given; `logprobs` are the target's (engines/logprobs.py): chat's `logprobs: true` with
`top_logprobs` 0..20, legacy completions' `logprobs` 0..5 (the number of top tokens).

`tools`, `tool_choice` and `response_format` are checked by router/api/structured.py (`check_structured`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from router.api.structured import check_structured
from router.http.errors import APIError
from specroute.contracts.limits import MAX_STOP_CHARS

INT32_MAX = 2**31 - 1
INT64 = 2**63
MAX_N = 16                  # choices per request (one worker call each)
MAX_TOP_LOGPROBS = 20       # chat's top_logprobs (the worker's bound, engines/logprobs.py)
MAX_LEGACY_LOGPROBS = 5     # legacy completions' logprobs (OpenAI's bound)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None   # an assistant turn's calls (router/api/structured.py)
    tool_call_id: str | None = None                  # a tool turn: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


# parameters of the OpenAI schemas that change nothing a worker samples (accepted as they are)
NO_EFFECT: frozenset[str] = frozenset({"user", "metadata", "service_tier", "prompt_cache_key", "safety_identifier",
                                       "parallel_tool_calls"})


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")   # unknown parameters are refused by name (`common_checks`)

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1, le=128)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    top_k: int | None = None             # not OpenAI's (vLLM's): -1 or 0 means off
    store: bool | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    best_of: int | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list):
            if len(v) > 4:
                raise ValueError("at most 4 stop sequences")
            if any(not s for s in v):
                raise ValueError("stop sequences must be non-empty")
        for s in [v] if isinstance(v, str) else v or ():
            if len(s) > MAX_STOP_CHARS:
                raise ValueError(f"each stop sequence must be at most {MAX_STOP_CHARS} characters")
            if "\x00" in s:
                raise ValueError("stop sequences must not contain null bytes")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None or self.stop == "":
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def effective_max_tokens(self) -> int | None:
        return self.max_tokens

    def choices(self) -> int:
        """How many choices to generate (`n`)."""
        return self.n or 1

    def top_logprobs_wanted(self) -> int | None:
        """How many top tokens to report with each token's logprob; None: no logprobs."""
        return self.top_logprobs or 0 if self.logprobs else None

    def common_checks(self) -> None:
        for name in self.model_extra or {}:
            if name not in NO_EFFECT:
                raise APIError(400, f"unsupported or unrecognized parameter: {name}", param=name,
                               code="unsupported_parameter")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0.0):
                raise APIError(400, f"{name} is not supported (only 0)", param=name, code="unsupported_parameter")
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias", code="unsupported_parameter")
        if self.top_k not in (None, -1, 0):
            raise APIError(400, "top_k is not supported (only -1 or 0: off)", param="top_k",
                           code="unsupported_parameter")
        if self.store:
            raise APIError(400, "store is not supported (completions are not stored)", param="store",
                           code="unsupported_parameter")
        if self.n is not None and self.n > MAX_N:
            raise APIError(400, f"n must be at most {MAX_N}", param="n", code="unsupported_parameter")
        if self.best_of is not None and self.best_of != 1:
            raise APIError(400, "best_of is not supported (only 1; use n for several choices)", param="best_of",
                           code="unsupported_parameter")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options",
                           code="invalid_value")


def reject_null_bytes(text: str, param: str) -> None:
    """A prompt must not contain NUL characters (they are no text, and tokenizers disagree about them)."""
    if "\x00" in text:
        raise APIError(400, f"{param} must not contain null bytes (\\u0000)", param=param, code="invalid_value")


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    modalities: list[str] | None = None
    functions: list[dict[str, Any]] | None = None  # the legacy form of `tools`: refused the same way
    function_call: Any = None
    response_format: dict[str, Any] | None = None

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def check_supported(self) -> None:
        self.common_checks()
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            raise APIError(400, "logprobs must be a boolean (the number of top tokens is top_logprobs)",
                           param="logprobs", code="invalid_value")
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
                raise APIError(400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs",
                               code="invalid_value")
            if not self.logprobs:
                raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs",
                               code="invalid_value")
        check_structured(self)   # response_format, tools, tool_choice, tool calls and tool messages
        if self.functions or self.function_call not in (None, "none"):
            param = "functions" if self.functions else "function_call"
            raise APIError(400, f"{param} (the legacy form of tools) is not supported", param=param,
                           code="unsupported_parameter")
        if self.modalities is not None and self.modalities != ["text"]:
            raise APIError(400, "modalities: only [\"text\"] is supported", param="modalities",
                           code="unsupported_parameter")
        for i, m in enumerate(self.messages):
            reject_null_bytes(m.text(), f"messages.{i}.content")
        if not any(m.role == "user" for m in self.messages) and not any(m.text() for m in self.messages):
            raise APIError(400, "messages must contain some text", param="messages", code="invalid_value")

    def wire_messages(self) -> list[tuple[str, str]]:
        return [("system" if m.role == "developer" else m.role, m.text()) for m in self.messages]

    def prompt_texts(self) -> list[str]:
        """What the prompt is made of (for the size bound before tokenizing)."""
        return [m.text() for m in self.messages]

    prompt_param: ClassVar[str] = "messages"


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: bool | None = False
    suffix: str | None = None

    def check_supported(self) -> None:
        self.common_checks()
        if self.top_logprobs is not None:
            raise APIError(400, "top_logprobs is a chat parameter (here logprobs is the number of top tokens)",
                           param="top_logprobs", code="unsupported_parameter")
        if self.logprobs is not None and self.logprobs is not False and (self.logprobs is True
                                                   or not 0 <= self.logprobs <= MAX_LEGACY_LOGPROBS):
            raise APIError(400, f"logprobs must be an integer in [0, {MAX_LEGACY_LOGPROBS}]", param="logprobs",
                           code="invalid_value")
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise APIError(400, "exactly one prompt per request is supported", param="prompt",
                           code="unsupported_parameter")
        if self.echo:
            raise APIError(400, "echo is not supported", param="echo", code="unsupported_parameter")
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix", code="unsupported_parameter")
        if not self.prompt_text():
            raise APIError(400, "prompt must not be empty", param="prompt", code="invalid_value")
        reject_null_bytes(self.prompt_text(), "prompt")

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def top_logprobs_wanted(self) -> int | None:
        """Legacy `logprobs` is the number of top tokens (0: the chosen token's only); None: none."""
        return None if self.logprobs is None or self.logprobs is False else int(self.logprobs)

    def prompt_texts(self) -> list[str]:
        return [self.prompt_text()]

    prompt_param: ClassVar[str] = "prompt"
