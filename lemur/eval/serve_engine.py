"""The model behind `lemur-eval serve`: checked requests in, OpenAI responses out, every
request's rows decoded together by one worker thread.

HTTP threads (lemur.eval.serve) tokenize a request, check its lengths and `submit` it as a
`Job`; the worker takes every job queued since its last pass and runs them as few device
calls as it can: the rows of all jobs that sample the same way (max tokens, temperature,
top-p/k, stops, seed, end ids) go through one `generate_ids` (the batched KV-cache decode,
`--batch-size` rows at a time), and every `echo`/`logprobs` sequence through one
`scoring.top_tokens` (the forward pass lm-eval's loglikelihood asks for). All JAX work
happens on the worker thread. Admission counts rows (prompts x n) from submit to answer:
over `--max-queue` a request gets a 429 (it is valid: retrying later succeeds), which
bounds memory however many clients connect.

A greedy `echo` + `logprobs` request for at most one new token, lm-eval's loglikelihood
request, is answered from the one scoring pass: its new token is the argmax after the
prompt, kept even when it is the end of sequence, since lm-eval drops the last token's
logprob by position.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from lemur.cli_common import one_line
from lemur.eval import serve_api as api
from lemur.eval.chat_prompt import chat_prompt_ids
from lemur.eval.decoding import Completion, GenerationConfig, continuation_text
from lemur.eval.generate import chat_ends, generate_ids, text_prompt_ids
from lemur.eval.humaneval import truncate  # text before the earliest stop string
from lemur.eval.sampling import Sampling
from lemur.model import scoring
from lemur.model.config import LlamaConfig, Params
from lemur.model.harness_lm import hf_decoder
from lemur.tokenizer import Tokenizer

LOGPROB_FLOOR = -9999.0  # what -inf is sent as
GATHER_S = 0.005  # how long the worker waits, after a first request, for the ones beside it


@dataclasses.dataclass
class Job:
    """One request's rows (prompt ids, repeated n times) and what the worker makes of them."""

    rows: list[list[int]]
    gen: GenerationConfig | None  # None: answered from scoring alone
    eos: tuple[int, ...]
    top: int  # > 0: score prompt + completion with this many top tokens
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    completions: list[Completion] | None = None
    scores: list[tuple[scoring.TokenScores, scoring.TopTokens]] | None = None
    error: BaseException | None = None


@dataclasses.dataclass
class Model:
    """What the worker runs: stacked params for scoring, per-layer ones for decoding."""

    config: LlamaConfig
    params: Params
    decode_params: Params
    tokenizer: Tokenizer
    name: str


class Engine:
    """The worker thread and its queue; `answer_*` turn checked requests into responses."""

    def __init__(self, model: Model, limits: api.Limits, batch_size: int) -> None:
        self.model = model
        self.limits = limits
        # Generated text as the export's tokenizer decodes it (lm-eval's HF backend's text;
        # SentencePiece keeps the valid bytes of a broken UTF-8 run, its byte fallback not).
        self.decode = hf_decoder(model.tokenizer)
        self.batch_size = batch_size
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._admitted = 0  # rows submitted and not yet answered
        self._thread = threading.Thread(target=self._loop, name="serve-worker", daemon=True)
        self.passes = 0  # worker passes, and the jobs they took (batching, for the log)
        self.jobs = 0

    @property
    def held(self) -> int:
        """Rows submitted and not yet answered."""
        with self._lock:
            return self._admitted

    def start(self) -> None:
        """Start the worker."""
        self._thread.start()

    def stop(self) -> None:
        """Finish the jobs queued, then end the worker."""
        self._queue.put(None)
        self._thread.join()

    def run(self, job: Job) -> Job:
        """Queue a job (429 when the server holds --max-queue rows), wait for its answer."""
        with self._lock:
            if self._admitted + len(job.rows) > self.limits.max_rows:
                raise api.ApiError(
                    429,
                    f"the server holds {self._admitted} rows and --max-queue is "
                    f"{self.limits.max_rows}: retry later",
                    "rate_limit_error",
                )
            self._admitted += len(job.rows)
        try:
            self._queue.put(job)
            job.done.wait()
        finally:
            with self._lock:
                self._admitted -= len(job.rows)
        if job.error is not None:
            raise job.error
        return job

    def _loop(self) -> None:
        """Take every job queued, run them together, answer each; until stop()."""
        while True:
            jobs = [self._queue.get()]
            # Clients that send at once arrive a few ms apart: waiting GATHER_S for them
            # makes one device pass of their rows instead of one per request.
            time.sleep(GATHER_S)
            while True:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = None in jobs
            work = [j for j in jobs if j is not None]
            if work:
                self.passes, self.jobs = self.passes + 1, self.jobs + len(work)
                self._work(work)
            if stopping:
                return

    def _work(self, jobs: list[Job]) -> None:
        """Generate, then score, each group of jobs; an error fails its group's jobs only."""
        groups: dict[tuple[Any, ...], list[Job]] = {}
        for job in jobs:
            if job.gen is not None:
                groups.setdefault((job.gen, job.eos), []).append(job)
        for (gen, eos), group in groups.items():
            _guarded(group, lambda g=group, c=gen, e=eos: self._generate(g, c, e))
        scored = [j for j in jobs if j.top > 0 and j.error is None]
        if scored:
            _guarded(scored, lambda: self._score(scored))
        for job in jobs:
            job.done.set()

    def _generate(self, jobs: list[Job], gen: GenerationConfig, eos: tuple[int, ...]) -> None:
        """One generate_ids over the rows of jobs that sample alike."""
        m = self.model
        rows = [r for j in jobs for r in j.rows]
        # Padded with copies of a row (answers dropped) to a power of two below the batch
        # size, else whole batches: a few batch shapes compile, not one per count of rows
        # (each compile keeps a few MB: memory would grow with the mix of requests).
        n, full = len(rows), self.batch_size
        target = min(1 << (n - 1).bit_length(), full) if n < full else -(-n // full) * full
        gen = dataclasses.replace(gen, batch_size=full)
        padded = rows + [rows[0]] * (target - n)
        done = generate_ids(
            m.decode_params, m.config, padded, gen, eos_id=eos, tokenizer=m.tokenizer
        )
        at = 0
        for job in jobs:
            job.completions, at = done[at : at + len(job.rows)], at + len(job.rows)

    def _score(self, jobs: list[Job]) -> None:
        """One scoring pass over prompt + completion of every row of the jobs."""
        seqs, spans = [], []
        for job in jobs:
            made = job.completions or [None] * len(job.rows)
            seqs += [r + (c.tokens if c else []) for r, c in zip(job.rows, made, strict=True)]
            spans.append((job, len(job.rows)))
        top = max(j.top for j in jobs)  # k compiles: at most MAX_LOGPROBS variants
        m = self.model
        scores = scoring.top_tokens(m.config, m.params, seqs, top, self.batch_size)
        at = 0
        for job, n in spans:
            job.scores, at = scores[at : at + n], at + n

    # --- requests in, responses out (called on HTTP threads) ---

    def prompt_ids(self, prompt: str | tuple[int, ...]) -> list[int]:
        """A completion prompt's ids as given: token ids checked against the vocabulary, or
        the text's ids with nothing added (no BOS: lm-eval's API client sends none)."""
        if isinstance(prompt, tuple):
            vocab = self.model.config.vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise api.bad(f"a prompt holds a token id outside 0 .. {vocab - 1}")
            return list(prompt)
        tok = self.model.tokenizer
        ids = text_prompt_ids(tok, prompt)
        return ids[1:] if tok.bos_id is not None else ids  # its head is the BOS

    def answer_completion(self, req: api.CompletionRequest) -> dict[str, Any]:
        """A `/v1/completions` response."""
        prompts = [self.prompt_ids(p) for p in req.prompts]
        s = req.settings
        for p in prompts:
            api.check_length(len(p), s.max_tokens, self.limits)
        fast = req.logprobs is not None and s.max_tokens <= 1 and s.temperature == 0
        gen = None if fast or s.max_tokens == 0 else _generation(s)
        top = max(1, req.logprobs or 0) if req.logprobs is not None or fast else 0
        rows = [p for p in prompts for _ in range(req.n)]
        job = self.run(Job(rows, gen, self.model.tokenizer.stop_ids, top))
        if fast and s.max_tokens == 1:
            job.completions = [
                self._argmax_token(r, sc, s.stop) for r, sc in zip(rows, job.scores, strict=True)
            ]
        choices, used = [], 0
        for i, row in enumerate(rows):
            made = job.completions[i] if job.completions else Completion(len(row), [], "", "length")
            # generate_ids stopped at the token completing a stop string; its text is
            # decoded again as the export decodes it, and cut there.
            made.text = truncate(self.decode(made.tokens), s.stop)
            scores = job.scores[i] if job.scores else None
            choices.append(self._text_choice(i, req, row, made, scores))
            used += len(made.tokens)
        return api.response("text", self.model.name, choices, (sum(map(len, rows)), used))

    def _argmax_token(
        self, row: list[int], scored: tuple[Any, scoring.TopTokens], stop: Sequence[str]
    ) -> Completion:
        """The greedy next token after `row`, read off its scoring pass (kept even when it
        ends the sequence), its text and why it ended."""
        token = int(scored[1].ids[-1][0])
        if token in self.model.tokenizer.stop_ids:
            return Completion(len(row), [token], "", "eos")
        text = self.decode([token])
        cut = truncate(text, stop)
        return Completion(len(row), [token], cut, "stop" if cut != text else "length")

    def _text_choice(
        self,
        index: int,
        req: api.CompletionRequest,
        row: list[int],
        made: Completion,
        scored: tuple[scoring.TokenScores, scoring.TopTokens] | None,
    ) -> dict[str, Any]:
        """One choice: the prompt's text before the completion with `echo`, the logprobs of
        the tokens shown with `logprobs`."""
        tok = self.model.tokenizer
        head = tok.decode(row) if req.echo else ""
        text = head + made.text
        logprobs = None
        if req.logprobs is not None and scored is not None:
            seq = row + made.tokens
            first = 0 if req.echo else len(row)
            logprobs = token_logprobs(tok, seq, scored, first, req.logprobs)
        return api.text_choice(index, text, made.finish, logprobs)

    def answer_chat(self, req: api.ChatRequest) -> dict[str, Any]:
        """A `/v1/chat/completions` response: the model's chat template, its end of turn."""
        tok = self.model.tokenizer
        try:
            prompt = chat_prompt_ids(tok, list(req.messages))
        except (ValueError, TypeError) as e:  # no ChatML pieces, no template, bad roles
            raise api.bad(f"this model cannot chat: {one_line(e)}") from None
        api.check_length(len(prompt), req.settings.max_tokens, self.limits)
        eos, stops = chat_ends(tok)
        gen = _generation(req.settings, stops)
        job = self.run(Job([prompt] * req.n, gen, eos, 0))
        done = job.completions or []
        texts = [truncate(self.decode(c.tokens), gen.stop) for c in done]
        choices = [api.chat_choice(i, texts[i], c.finish) for i, c in enumerate(done)]
        used = sum(len(c.tokens) for c in done)
        return api.response("chat", self.model.name, choices, (len(prompt) * req.n, used))


def _guarded(jobs: Sequence[Job], work: Callable[[], None]) -> None:
    """Run `work`; an error fails these jobs (their requests answer it), not the worker."""
    try:
        work()
    except Exception as e:  # noqa: BLE001 - handed to each request, which reports it
        for job in jobs:
            job.error = e


def _generation(s: api.Settings, extra_stops: tuple[str, ...] = ()) -> GenerationConfig:
    """The GenerationConfig of a request's settings (batch size is the server's)."""
    return GenerationConfig(
        max_new_tokens=s.max_tokens,
        sampling=Sampling(s.temperature, s.top_k, s.top_p),
        stop=(*extra_stops, *s.stop),
        seed=s.seed,
    )


def _finite(logprob: Any) -> float:
    """A logprob JSON can carry: -inf (a token fp32 gives no probability at all) becomes
    LOGPROB_FLOOR, as vLLM answers it (JSON has no infinity; `-Infinity` breaks strict
    parsers)."""
    return max(float(logprob), LOGPROB_FLOOR)


def token_logprobs(
    tok: Tokenizer,
    seq: list[int],
    scored: tuple[scoring.TokenScores, scoring.TopTokens],
    first: int,
    k: int,
) -> dict[str, Any]:
    """OpenAI's legacy logprobs of seq[first:]: each token's text (what it adds to the text
    decoded so far, so the pieces join to the choice's text), its logprob (None for token
    0: nothing before it), the k most likely tokens there and its character offset."""
    scores, top = scored
    # Prefixes decoded whole: a piece decoded alone loses a dummy prefix's space.
    texts = [tok.decode(seq[:i]) for i in range(first, len(seq) + 1)]
    offsets = [len(t) for t in texts]
    pieces = [texts[j + 1][offsets[j] :] for j in range(len(seq) - first)]
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    for j, i in enumerate(range(first, len(seq))):
        if i == 0:
            lps.append(None)
            tops.append(None)
            continue
        # Past the scored tokens: the scoring path's new token, the argmax after them.
        scored_here = i - 1 < len(scores.logprobs)
        lps.append(_finite(scores.logprobs[i - 1] if scored_here else top.logprobs[i - 1][0]))
        shown = {}
        for t, lp in zip(top.ids[i - 1][:k], top.logprobs[i - 1][:k], strict=True):
            same = int(t) == seq[i]
            piece = pieces[j] if same else continuation_text(tok, seq[:i], [int(t)], texts[j])
            shown[piece] = _finite(lp)
        tops.append(shown)
    return api.logprobs_object(pieces, offsets[:-1], lps, tops)
