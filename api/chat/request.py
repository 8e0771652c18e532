"""The chat request every protocol is translated into: ``ChatRequest``.

Contract: ``POST /chat`` takes it as its body; /ui/chat and /ag-ui build one from their
own protocol's turn (``chat/turns.start_turn``), so a malformed turn is the same 422
naming the field whichever protocol carried it. Strict JSON types as documented.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..names import conversation_id_schema
from ..schemas import json_int
from .policy import Policy
from .selected_files import MAX_SELECTED, SelectedFileRef, selected_files_field

_Iterations = json_int(ge=1, le=100)
# The whole history's text, beyond each turn's own cap: more than any model's context
# window, and every tool step of a run re-sends it, so one request cannot make the API
# hold and re-send megabytes per step (the body limit alone would allow ~8 MiB).
MAX_HISTORY_CHARS = 1_000_000


class HistoryMessage(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as documented: no "1" for 1

    role: Literal["user", "assistant"]
    content: str = Field(max_length=200_000)
    selected_files: list[SelectedFileRef] = Field(
        default_factory=list,
        max_length=MAX_SELECTED,
        strict=True,
        description="A user turn's own selection (seed 000 §7.4): its context message is "
        "rebuilt just before it. The same forms as the request's `selected_files`; a file "
        "deleted since is still named (where it was).",
    )

    @model_validator(mode="after")
    def _files_on_user_turns(self) -> HistoryMessage:
        if self.selected_files and self.role != "user":
            raise ValueError("selected_files belongs to user turns only")
        return self


class ChatRequest(BaseModel):
    """seed 000 §7.6 ChatReq."""

    model_config = ConfigDict(strict=True)  # JSON types as documented: no "1" for 1

    query: str = Field(
        min_length=1,
        max_length=100_000,
        pattern=r"\S",
        description="The user's message (not blank).",
    )
    conversation_id: str = Field(json_schema_extra=conversation_id_schema())
    agent_id: str = Field("", max_length=253)
    history: list[HistoryMessage] = Field(
        default_factory=list,
        max_length=500,
        description=f"Earlier turns, oldest first: at most 500, {MAX_HISTORY_CHARS} "
        "characters of content in all.",
    )
    selected_files: list[SelectedFileRef] = selected_files_field()
    tool_policies: dict[str, Policy] | None = Field(
        None,
        description="Per tool, only stricter than the configured policy (the schema lists "
        "each tool and the values allowed on this deployment).",
    )
    max_iterations: _Iterations | None = None

    @model_validator(mode="after")
    def _history_total(self) -> ChatRequest:
        total = sum(len(m.content) for m in self.history)
        if total > MAX_HISTORY_CHARS:
            raise ValueError(
                f"history holds {total} characters in all, more than {MAX_HISTORY_CHARS}: "
                "send the latest turns only (the model cannot take more anyway)"
            )
        return self
