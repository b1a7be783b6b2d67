"""Chat sources: each schema normalized to messages and rendered as ChatML with loss spans;
bad conversations dropped by reason with their neighbours kept; recipe errors."""

from __future__ import annotations

import pytest

from lemur.data.read.chat import (
    EMPTY_ASSISTANT,
    ENDS_ON_USER,
    IM_END,
    IM_START,
    MARKER_IN_CONTENT,
    NO_TURNS,
    NOT_ALTERNATING,
    UNKNOWN_ROLE,
    ChatDrop,
    check_messages,
    render_chatml,
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]
RENDERED = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\n2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n"
)


def test_render_chatml_text_spans_and_turn_ends():
    text, spans, ends = render_chatml(CONVERSATION)
    assert text == RENDERED
    assert [text[s:e] for s, e in spans] == ["Hello!<|im_end|>", "4<|im_end|>"]
    assert text[spans[0][0] - len("assistant\n") - len(IM_START) : spans[0][0]] == (
        "<|im_start|>assistant\n"
    )
    assert all(text[e] == "\n" for _, e in spans)  # the newline after the marker is not trained
    assert ends[-1] == len(text) and len(ends) == 5
    assert [text[a:b] for a, b in zip([0, *ends], ends, strict=False)][2] == (
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )
    assert spans == [[text.index("Hello!"), text.index("Hello!") + 16], [ends[3] + 22, ends[4] - 1]]
    assert IM_END == "<|im_end|>" and IM_START == "<|im_start|>"


@pytest.mark.parametrize(
    "messages, reason",
    [
        ([], NO_TURNS),
        ([{"role": "system", "content": "s"}], NO_TURNS),
        ([{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}], UNKNOWN_ROLE),
        ([{"role": "assistant", "content": "a"}], NOT_ALTERNATING),
        ([{"role": "user", "content": "q"}, {"role": "user", "content": "q"}], NOT_ALTERNATING),
        (
            [{"role": "system", "content": "s"}, {"role": "system", "content": "s"}],
            NOT_ALTERNATING,
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": " \n"}],
            EMPTY_ASSISTANT,
        ),
        ([{"role": "user", "content": "q"}], ENDS_ON_USER),
        (CONVERSATION[:4], ENDS_ON_USER),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a<|im_end|>"}],
            MARKER_IN_CONTENT,
        ),
    ],
)
def test_check_messages_refuses_with_reason(messages, reason):
    with pytest.raises(ChatDrop) as e:
        check_messages(messages)
    assert e.value.reason == reason
