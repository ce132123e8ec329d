from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls_json", "tool_call_id", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls_json: str
    tool_call_id: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls_json: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "has_seed", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    HAS_SEED_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    has_seed: bool
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., has_seed: _Optional[bool] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "messages", "prompt", "sampling", "max_tokens", "stop", "domain", "pool", "disable_dcut", "coalesce", "context", "mode", "features", "temperature_bucket", "prefix_token_ids", "prefix_chars", "grammar", "tools_json", "logprobs", "top_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DISABLE_DCUT_FIELD_NUMBER: _ClassVar[int]
    COALESCE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_BUCKET_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CHARS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    prompt: str
    sampling: SamplingParams
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    domain: str
    pool: str
    disable_dcut: bool
    coalesce: bool
    context: str
    mode: str
    features: _containers.RepeatedScalarFieldContainer[float]
    temperature_bucket: str
    prefix_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prefix_chars: int
    grammar: str
    tools_json: str
    logprobs: bool
    top_logprobs: int
    def __init__(self, request_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., prompt: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., domain: _Optional[str] = ..., pool: _Optional[str] = ..., disable_dcut: _Optional[bool] = ..., coalesce: _Optional[bool] = ..., context: _Optional[str] = ..., mode: _Optional[str] = ..., features: _Optional[_Iterable[float]] = ..., temperature_bucket: _Optional[str] = ..., prefix_token_ids: _Optional[_Iterable[int]] = ..., prefix_chars: _Optional[int] = ..., grammar: _Optional[str] = ..., tools_json: _Optional[str] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "token_bytes", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., token_bytes: _Optional[bytes] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class SpecStats(_message.Message):
    __slots__ = ("drafted_tokens", "accepted_tokens", "steps", "mean_accepted_length", "accepted_per_position", "steps_by_drafter")
    class StepsByDrafterEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    STEPS_BY_DRAFTER_FIELD_NUMBER: _ClassVar[int]
    drafted_tokens: int
    accepted_tokens: int
    steps: int
    mean_accepted_length: float
    accepted_per_position: _containers.RepeatedScalarFieldContainer[int]
    steps_by_drafter: _containers.ScalarMap[str, int]
    def __init__(self, drafted_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., steps: _Optional[int] = ..., mean_accepted_length: _Optional[float] = ..., accepted_per_position: _Optional[_Iterable[int]] = ..., steps_by_drafter: _Optional[_Mapping[str, int]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "num_tokens", "finish_reason", "prompt_tokens", "completion_tokens", "stats", "token_ids", "cached_prompt_tokens", "logprobs", "ttft_ms")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    text: str
    num_tokens: int
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stats: SpecStats
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    cached_prompt_tokens: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    ttft_ms: float
    def __init__(self, text: _Optional[str] = ..., num_tokens: _Optional[int] = ..., finish_reason: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., stats: _Optional[_Union[SpecStats, _Mapping]] = ..., token_ids: _Optional[_Iterable[int]] = ..., cached_prompt_tokens: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., ttft_ms: _Optional[float] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_id", "engine", "drafter", "block_size", "max_context", "max_running", "max_waiting", "dcut", "version", "compute_bound_tokens", "modes")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_FIELD_NUMBER: _ClassVar[int]
    DCUT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_BOUND_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODES_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    engine: str
    drafter: str
    block_size: int
    max_context: int
    max_running: int
    max_waiting: int
    dcut: bool
    version: str
    compute_bound_tokens: float
    modes: _containers.RepeatedCompositeFieldContainer[EngineMode]
    def __init__(self, model_id: _Optional[str] = ..., engine: _Optional[str] = ..., drafter: _Optional[str] = ..., block_size: _Optional[int] = ..., max_context: _Optional[int] = ..., max_running: _Optional[int] = ..., max_waiting: _Optional[int] = ..., dcut: _Optional[bool] = ..., version: _Optional[str] = ..., compute_bound_tokens: _Optional[float] = ..., modes: _Optional[_Iterable[_Union[EngineMode, _Mapping]]] = ...) -> None: ...

class EngineMode(_message.Message):
    __slots__ = ("engine", "drafter", "block_size")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    engine: str
    drafter: str
    block_size: int
    def __init__(self, engine: _Optional[str] = ..., drafter: _Optional[str] = ..., block_size: _Optional[int] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadResponse(_message.Message):
    __slots__ = ("running", "waiting", "cache_usage", "tokens_per_s", "mean_accepted_length", "max_running", "dcut_enabled", "kept_ratio")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    DCUT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    KEPT_RATIO_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    cache_usage: float
    tokens_per_s: float
    mean_accepted_length: float
    max_running: int
    dcut_enabled: bool
    kept_ratio: float
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., cache_usage: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., mean_accepted_length: _Optional[float] = ..., max_running: _Optional[int] = ..., dcut_enabled: _Optional[bool] = ..., kept_ratio: _Optional[float] = ...) -> None: ...

class SetDcutRequest(_message.Message):
    __slots__ = ("enabled",)
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    def __init__(self, enabled: _Optional[bool] = ...) -> None: ...
