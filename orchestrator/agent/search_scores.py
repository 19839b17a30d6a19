"""How a `search_tools` query (or a task's brief) matches a catalogue entry, and how well.

Tool discovery (seed 000) finds tools by exact name, description words and tags, and Chinese
capability words such as 整理, 工单, 采样 and 水质 work too, through a small zh/en alias table
(`ALIASES`). `Catalogue.rank` keeps the entries that score above 0, best first, so a query that
matches nothing finds nothing and never the whole catalogue.

A query is lower-cased; its words (and the one-word targets of the aliases it contains) lose
the stopwords and, when long enough, an ending (-ing, -es, -ed, -s), and are compared with the
entry's name words (a camelCase or snake_case name split into words), tags and description
words, built the same way when the catalogue makes the entry (`split_name`, `stems`, `WORD`).
The whole query being the entry's name or operation id, or one of its words the name, outweighs
everything else; an alias target of several words, and a run of Chinese characters, count when
they appear in the entry's text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from orchestrator.agent.catalogue import Entry

__all__ = ["ALIASES", "WORD", "score", "split_name", "stems"]

#: The small zh/en capability alias table: a query word on the left also searches the right.
ALIASES: Final[Mapping[str, tuple[str, ...]]] = {
    "整理": ("transfer", "organize"),
    "转移": ("transfer",),
    "工单": ("work order", "work_order", "order", "ticket"),
    "订单": ("order",),
    "采样": ("sampling", "sample"),
    "样本": ("sample",),
    "水质": ("water quality", "quality"),
    "压力": ("pressure",),
    "流量": ("flow",),
    "阀门": ("valve",),
    "泵": ("pump",),
    "传感器": ("sensor",),
    "告警": ("alarm", "alert"),
    "报警": ("alarm", "alert"),
    "设置": ("setting", "settings", "config"),
    "配置": ("config", "setting"),
    "报告": ("report",),
    "命令": ("command", "shell"),
    "终端": ("command", "terminal"),
    "日志": ("log", "logs"),
    "下载": ("download",),
    "任务": ("job", "task"),
    "查询": ("get", "read", "query", "list"),
    "删除": ("delete", "remove"),
    "创建": ("create",),
    "接口": ("api", "operation"),
    "ticket": ("work order",),
    "workorder": ("work order",),
}

_STOPWORDS: Final = frozenset(
    {"a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "how", "in", "is", "it"}
    | {"of", "on", "or", "the", "to", "what", "with", "task", "condition", "tool", "tools"}
)
WORD = re.compile(r"[a-z0-9]+")
_CJK = re.compile(r"[\u3400-\u9fff]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_EXACT, _NAME, _TAG, _PHRASE, _DESCRIPTION, _CJK_TEXT = 1000, 10, 6, 6, 3, 4


def score(entry: Entry, query: str) -> int:
    text = query.strip().lower()
    if not text:
        return 0
    score = 0
    if text == entry.name.lower() or (
        entry.operation_id is not None and text == entry.operation_id.lower()
    ):
        score += _EXACT
    words = [word for word in WORD.findall(text) if word not in _STOPWORDS]
    for word in words:
        if word == entry.name.lower():
            score += _EXACT
    phrases: list[str] = []
    for key, targets in ALIASES.items():
        if key in text:
            for target in targets:
                (phrases if " " in target else words).append(target)
    for stem in stems(words):
        if stem in entry._names:
            score += _NAME
        if stem in entry._tags:
            score += _TAG
        if stem in entry._words:
            score += _DESCRIPTION
    for phrase in phrases:
        if phrase in entry._text:
            score += _PHRASE
    for run in _CJK.findall(text):
        if run in entry._text:
            score += _CJK_TEXT
    return score


def split_name(name: str) -> list[str]:
    return WORD.findall(_CAMEL.sub(" ", name).lower())


def stems(words: Sequence[str]) -> list[str]:
    return [_stem(word) for word in words if word not in _STOPWORDS]


def _stem(word: str) -> str:
    for suffix in ("ing", "es", "ed", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word
