"""Chat messages <-> token ids for multi-turn episodes, with the tokenizer's own chat template.

The runner (`ascent.envs.runner`) and supervised warm-start on conversations (`ascent.data.sft`) both build an
episode's tokens here, so a demonstration trains on exactly the ids an episode of the same conversation
samples: the prompt rendered once with its generation prompt, each model turn as its text's ids plus the
end-of-turn token, each observation as the ids the template appends after a finished turn
(`continuation_ids`), never a re-render of the history. Only the tokenizer is needed (no other ascent import).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Tools = Sequence[Mapping[str, Any]] | None  # function schemas the chat template describes to the model

Message = Mapping[str, Any]  # role, content (and, in SFT demonstrations, an assistant turn's loss weight)

_PROBE = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class ChatTokens:
    """Messages -> token ids with a tokenizer's chat template; turns' text back from ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    def _render(self, messages: Sequence[Message], generation_prompt: bool, tools: Tools = None) -> str:
        # an SFT demonstration's loss weights are the trainer's, not the model's to read
        shown = [{k: v for k, v in m.items() if k not in ("weight", "no_loss")} for m in messages]
        out = self.tok.apply_chat_template(
            shown, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(out)

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message], tools: Tools = None) -> list[int]:
        """The conversation before the first model turn, ending with the assistant's generation prompt
        (`tools`: function schemas the template describes to the model)."""
        return self._encode(self._render(messages, True, tools))

    def continuation_ids(self, messages: Sequence[Message]) -> list[int]:
        """The ids the chat template adds after a model turn that ended on the end-of-turn token: the
        observation `messages`, then the next generation prompt. Found by rendering a probe conversation
        with and without them; an error if the template rewrites the earlier turns."""
        end = str(self.tok.eos_token)
        before = self._render(_PROBE, False)
        after = self._render([*_PROBE, *messages], True)
        cut = before.rfind(end) + len(end)
        if cut < len(end) or not after.startswith(before[:cut]):
            raise ValueError(
                "the chat template renders earlier turns differently once an observation follows (or the "
                f"assistant turn does not end with {end!r}); multi-turn episodes need a template that only "
                "appends."
            )
        return self._encode(after[cut:])

    def turn_text(self, message: Message) -> str:
        """An assistant message's text as the model writes it: its content, or, when it calls tools
        (`tool_calls` in template form, `ascent.models.tool_calls`), what the chat template renders after the
        generation prompt: the content and the calls in the model family's own format (Qwen's `<tool_call>`
        blocks, ...), the text the engine samples and the tool parsers read. A ValueError when the template
        renders no calls (they would be dropped) or renders the turn other than after its generation prompt."""
        if not message.get("tool_calls"):
            return str(message["content"])
        end = str(self.tok.eos_token)
        head = self._render(_PROBE[:1], True)
        full = self._render([*_PROBE[:1], message], False)
        bare = self._render([*_PROBE[:1], {k: v for k, v in message.items() if k != "tool_calls"}], False)
        stop = full.rfind(end)
        if not full.startswith(head) or stop < len(head):
            raise ValueError(
                "the chat template renders an assistant turn with tool_calls other than as its generation "
                f"prompt followed by the turn and {end!r}; write each call as text in the content instead"
            )
        names = [str(c["function"]["name"]) for c in message["tool_calls"]]
        if full == bare or not all(name in full[len(head) : stop] for name in names):
            raise ValueError(
                "the chat template does not render assistant 'tool_calls', so the calls would be dropped; "
                "use the model's own chat template (one that renders tool_calls), or write each call as "
                "text in the content, as the model writes it"
            )
        return full[len(head) : stop]

    def turn_ids(self, text: str) -> list[int]:
        """A model turn as the engine samples it: the text's ids, then the end-of-turn (EOS) token."""
        return [*self._encode(text), int(self.tok.eos_token_id)]

    def conversation_ids(
        self, messages: Sequence[Message], tools: Tools = None, turn_end_loss: bool = True
    ) -> tuple[list[int], list[int], list[int]]:
        """A whole conversation -> (prompt ids, response ids, loss mask [len(response ids)]).

        The prompt is every message before the first assistant turn; after it, assistant turns have mask 1
        and the other messages (tool results, the world's answers) mask 0. An assistant message with
        `"weight": 0` (OpenAI fine-tuning's per-message weight; default 1) is in the ids with mask 0: the
        model sees it, the loss does not. `turn_end_loss=False` leaves each turn's end-of-turn token out of
        the loss. An assistant message's `"no_loss"` (a list of substrings of its content) leaves the tokens
        that overlap any occurrence of them out of the loss too. An assistant message's `tool_calls` are in
        its turn's text (`turn_text`) and in the loss like it. It must end on an assistant turn.
        """
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None or first == 0 or messages[-1]["role"] != "assistant":
            raise ValueError(
                "a conversation needs at least one message before the first assistant turn and must end "
                "with an assistant turn"
            )
        ids: list[int] = []
        mask: list[int] = []
        pending: list[Message] = []
        for m in messages[first:]:
            if m["role"] != "assistant":
                pending.append(m)
                continue
            if pending:  # what the world said since the last model turn
                obs = self.continuation_ids(pending)
                ids, mask, pending = ids + obs, mask + [0] * len(obs), []
            text = self.turn_text(m)
            turn = self.turn_ids(text)
            weights = turn_mask(len(turn), int(m.get("weight", 1)), turn_end_loss)
            if m.get("no_loss"):  # the end-of-turn token is not in the text: the no_loss spans leave it be
                kept = [*self._kept(text, m["no_loss"]), 1]
                weights = [w * k for w, k in zip(weights, kept, strict=True)]
            ids, mask = ids + turn, mask + weights
        return self.prompt_ids(messages[:first], tools), ids, mask

    def _kept(self, text: str, no_loss: Sequence[str]) -> list[int]:
        """Per token of `text` (as `_encode` splits it): 0 where the token overlaps an occurrence of a
        `no_loss` substring, else 1. Needs a fast tokenizer (character offsets)."""
        out = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(out["input_ids"]) != self._encode(text):
            raise ValueError(
                "'no_loss' needs a tokenizer whose offsets match its encoding (a fast tokenizer)"
            )
        spans = [(m.start(), m.end()) for s in no_loss for m in re.finditer(re.escape(s), text)]
        return [0 if any(a < e and s < b for s, e in spans) else 1 for a, b in out["offset_mapping"]]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))


def turn_mask(n: int, weight: int, turn_end_loss: bool) -> list[int]:
    """The loss mask [n] of a model turn of `n` ids ending in the end-of-turn token: `weight` (0 or 1) on
    its text, and on its end-of-turn token too unless `turn_end_loss` is False."""
    return [weight] * (n - 1) + [weight if turn_end_loss else 0]
