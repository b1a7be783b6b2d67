"""Tool turns under Llama-3.1's official chat template (tests/llama31_chat_template.jinja),
against transformers' `apply_chat_template`.

The template writes a tool output as `message.content | tojson`: a newline, a quote or a
backslash is escaped, so the output is not in the render as is. Only the assistant turns
are trained on, so only they must be found verbatim: the conversations below (CodeAct-style
trajectories: assistant code, its real output, the assistant again) keep their ids
(`apply_chat_template(messages, tokenize=True)`) and a mask of exactly each reply and its
`<|eot_id|>`, from the chat file through the build's template stage. ChatML's markers are
plain text to Llama-3: a conversation spelling them is kept too.
"""

from __future__ import annotations

import json
import shutil
import traceback
from pathlib import Path

import numpy as np
import pytest
from bytelevel_fixtures import llama3_folder
from conftest import write_jsonl

from lemur.chat_template import CONTROL_TEXT, ChatTemplate, TemplateDrop
from lemur.data.encode.chat import MASK_KEY, TOKENS_KEY
from lemur.data.encode.template_chat import TemplateChatEncoder
from lemur.data.read.listing import list_inputs
from lemur.data.read.sources import SourcesReader
from lemur.data.recipe_loader import recipe_from_dict
from lemur.tokenizer import open_tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LLAMA31_TEMPLATE = (Path(__file__).parent / "llama31_chat_template.jinja").read_text()


def real_traceback() -> str:
    """The traceback Python prints for a JSON document with a trailing comma."""
    try:
        json.loads('{"rows": 3,}')
    except ValueError:
        return traceback.format_exc()
    raise AssertionError("json accepted a trailing comma")


def conversations() -> list[list[dict[str, str]]]:
    """Agent trajectories whose tool outputs hold newlines, quotes, backslashes, tabs."""
    listing = json.dumps({"path": "C:\\Users\\ana\\data.csv", "cols": ["id", "name"]}, indent=2)
    return [
        [
            {"role": "system", "content": "You are a coding agent. Run Python in ```python blocks."},
            {"role": "user", "content": 'Load the config "{\\"rows\\": 3,}" as JSON.'},
            {"role": "assistant", "content": "```python\nimport json\njson.loads('{\"rows\": 3,}')\n```"},
            {"role": "tool", "content": real_traceback()},
            {"role": "assistant", "content": "It has a trailing comma; without it:\n```python\nprint(json.loads('{\"rows\": 3}'))\n```"},
            {"role": "tool", "content": "{'rows': 3}\n"},
            {"role": "assistant", "content": "Parsed: `{'rows': 3}`."},
        ],
        [
            {"role": "user", "content": "Describe the dataset file."},
            {"role": "assistant", "content": "```python\nprint(json.dumps(meta, indent=2))\n```"},
            {"role": "tool", "content": listing + "\n"},
            {"role": "assistant", "content": "It lives at `C:\\Users\\ana\\data.csv` with columns id and name."},
            {"role": "user", "content": "And the raw bytes of the header?"},
            {"role": "assistant", "content": "```python\nprint(repr(open(p, 'rb').read(12)))\n```"},
            {"role": "tool", "content": "b'id\\tname\\r\\n1\\t\"a\"'\n"},
            {"role": "assistant", "content": "Tab-separated, CRLF line ends, names quoted."},
        ],
        [
            # ChatML's markers are text to Llama-3, in any turn.
            {"role": "user", "content": "Why does my Qwen prompt end in <|im_end|>?"},
            {"role": "assistant", "content": "```python\nprint(tok.decode([151645]))\n```"},
            {"role": "tool", "content": "<|im_end|>\n"},
            {"role": "assistant", "content": "Id 151645 is `<|im_end|>`; each turn starts with `<|im_start|>`."},
        ],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def llama31(tmp_path_factory) -> Path:
    """Llama-3's real tokenizer with Llama-3.1-Instruct's official chat template."""
    return with_template(llama3_folder(tmp_path_factory.mktemp("llama3")), LLAMA31_TEMPLATE)


def with_template(folder: Path, template: str, out: Path | None = None) -> Path:
    """`folder` (or a copy of it at `out`) with `template` as its chat template."""
    if out is not None:
        folder = Path(shutil.copytree(folder, out))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(chat_template=template, eos_token="<|eot_id|>")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def hf(llama31):
    return transformers.AutoTokenizer.from_pretrained(str(llama31))


def hf_ids(tok, msgs) -> list[int]:
    ids = tok.apply_chat_template(msgs, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def test_tool_outputs_rendered_as_json_keep_ids_and_train_only_the_replies(llama31, hf):
    tok = open_tokenizer(llama31)
    template = ChatTemplate(tok)
    for msgs in conversations():
        chat = template.encode(msgs)
        assert chat.ids.tolist() == hf_ids(hf, msgs)
        assert chat.text == hf.apply_chat_template(msgs, tokenize=False)
        tool = next(m["content"] for m in msgs if m["role"] == "tool")
        assert json.dumps(tool, ensure_ascii=False) in chat.text  # escaped, not as is
        replies = [m["content"].strip() for m in msgs if m["role"] == "assistant"]
        trained = [tok.decode(chat.ids[a:b].tolist()) for a, b in runs(chat.mask)]
        assert trained == [r + "<|eot_id|>" for r in replies]


def test_a_tool_output_the_template_turns_into_a_control_token_drops(llama31, tmp_path):
    """A template that rewrites a tool output (`lower`) could make it spell a control token:
    transformers reads `<|eot_id|>` there, so the conversation is dropped."""
    lower = LLAMA31_TEMPLATE.replace(
        "{{- message.content | tojson }}", "{{- message.content | lower }}"
    )
    folder = with_template(llama31, lower, tmp_path / "lower")
    msgs = conversations()[0][:4] + [{"role": "assistant", "content": "Done."}]
    msgs[3] = {"role": "tool", "content": "Traceback ...\nSTOP <|EOT_ID|>\n"}
    eot = hf_ids(transformers.AutoTokenizer.from_pretrained(str(folder)), msgs).count(128009)
    assert eot == 6  # the template's five and the one the tool output became
    template = ChatTemplate(open_tokenizer(folder))
    with pytest.raises(TemplateDrop) as drop:
        template.encode(msgs)
    assert drop.value.reason == CONTROL_TEXT
    msgs[3]["content"] = "Traceback ...\nSTOP\n"  # the same without it is kept
    assert template.encode(msgs).mask.any()


def test_tool_conversations_are_kept_from_the_file_to_the_tokens(llama31, hf, tmp_path):
    """The chat reader and the build's template stage keep every conversation, ids and
    masks as above: nothing dropped, not even the one spelling ChatML's markers."""
    convs = conversations()
    data = write_jsonl(tmp_path / "agent.jsonl", [{"messages": m} for m in convs])
    recipe = recipe_from_dict(
        {
            "output": str(tmp_path / "out"),
            "tokenizer": {"hf": str(llama31)},
            "executor": {"tasks": 1, "workers": 1},
            "sources": [
                {"name": "agent", "format": "chat", "schema": "messages", "paths": [str(data)]}
            ],
        }
    )
    files = list_inputs(recipe).files
    reader = SourcesReader(files, recipe.sources, errors_dir=str(tmp_path / "errors"))
    step = TemplateChatEncoder(str(llama31 / "tokenizer.json"), seq_len=4096)
    kept = list(step.run(d for f in files for d in reader.read(f)))
    assert [d.metadata[TOKENS_KEY].tolist() for d in kept] == [hf_ids(hf, m) for m in convs]
    stats = {**reader.stats.stats, **step.stats.stats}
    assert stats["read:agent"].total == 3
    assert not [k for k in stats if k.startswith("dropped:")]
    assert all(d.metadata[MASK_KEY].sum() > 0 for d in kept)
