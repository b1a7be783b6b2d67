"""Multi-turn decoding with the KV cache kept across turns: every reply equals what
`generate_ids` gives for the turn's whole prompt, while only the new ids are prefilled."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_eval_generate import _model

from lemur.eval import generate as gen_lib
from lemur.eval.agent_decode import TurnDecoder, common_prefix
from lemur.eval.decoding import GenerationConfig

GEN = GenerationConfig(max_new_tokens=12, batch_size=2, chunk=8)


def reference(prompt: list[int], eos_id: int | None = None) -> list[int]:
    """Greedy ids of the whole prompt through generate's left-padded prefill and decode."""
    config, params = _model()
    [out] = gen_lib.generate_ids(params, config, [prompt], GEN, eos_id=eos_id)
    return out.tokens


def ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(3, 256, n).tolist()


@pytest.mark.parametrize("reuse", [True, False])
def test_turns_equal_generate_and_prefill_only_new_ids(reuse: bool) -> None:
    config, params = _model()
    decoder = TurnDecoder(params, config, GEN, reuse=reuse)
    rng = np.random.default_rng(3)
    convs = {"a": [1, *ids(rng, 9)], "b": [1, *ids(rng, 30)], "c": [1, *ids(rng, 4)]}
    new = dict.fromkeys(convs, -1)  # ids new since the conversation's last turn; -1: all
    live = ["a", "b"]  # two rows: c waits for a's
    for turn in range(3):
        turns = decoder.reply([(c, convs[c]) for c in live])
        for c, t in zip(live, turns, strict=True):
            assert t.prompt_ids == convs[c]
            assert t.completion.tokens == reference(convs[c]), (c, turn)
            assert t.prefilled == (new[c] if reuse and new[c] >= 0 else len(convs[c])), (c, turn)
            observation = ids(rng, 5 + turn)
            convs[c] = [*convs[c], *t.completion.tokens, *observation]
            new[c] = len(observation)
        if turn == 0:  # a is done: c takes its row
            decoder.release("a")
            live = ["c", "b"]


def test_a_reply_tokenized_otherwise_is_cut_back_and_refilled() -> None:
    """When the transcript's ids differ inside the cached reply, the row keeps only the
    common prefix and prefills the rest: the reply is still generate's."""
    config, params = _model()
    decoder = TurnDecoder(params, config, GEN)
    prompt = [1, *ids(np.random.default_rng(4), 20)]
    [t] = decoder.reply([("x", prompt)])
    reply = list(t.completion.tokens)
    reply[5] = 3 if reply[5] != 3 else 4  # the re-encoded reply differs at its 6th id
    second = [*prompt, *reply, 7, 8, 9]
    [t2] = decoder.reply([("x", second)])
    assert common_prefix(second, [*prompt, *t.completion.tokens]) == len(prompt) + 5
    assert t2.prefilled == len(second) - (len(prompt) + 5)
    assert t2.completion.tokens == reference(second)


def test_rows_ending_at_eos_at_different_steps() -> None:
    config, params = _model()
    rng = np.random.default_rng(5)
    prompts = [[1, *ids(rng, 6)], [1, *ids(rng, 11)]]
    eos = reference(prompts[0])[3]  # the first row ends after 3 tokens
    expected = [reference(p, eos_id=eos) for p in prompts]
    assert len(expected[0]) == 3 and len(expected[1]) != 3
    decoder = TurnDecoder(params, config, GEN, eos_id=eos)
    turns = decoder.reply(list(enumerate(prompts)))
    assert [t.completion.tokens for t in turns] == expected
    assert [t.completion.finish for t in turns][0] == "eos"
    follow = [[*p, *e, eos, 9, 9] for p, e in zip(prompts, expected, strict=True)]
    turns = decoder.reply(list(enumerate(follow)))
    assert [t.completion.tokens for t in turns] == [reference(f, eos_id=eos) for f in follow]
    assert [t.prefilled for t in turns][0] == 3  # eos, 9, 9: eos was sampled, never fed


def test_prompts_beyond_max_seq_len_are_refused() -> None:
    config, params = _model()
    decoder = TurnDecoder(params, config, dataclasses.replace(GEN, max_new_tokens=40))
    assert decoder.fits(config.max_seq_len - 40) and not decoder.fits(config.max_seq_len - 39)
    with pytest.raises(ValueError, match="no room"):
        decoder.reply([("x", [1] * (config.max_seq_len - 39))])
