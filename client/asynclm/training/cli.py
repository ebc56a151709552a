"""The ``oven asynclm-data``, ``-train``, ``-onpolicy`` and ``-soup`` verbs: their arguments and handlers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_DATA_DIR = "asynclm-data"
DEFAULT_ADAPTER_DIR = "asynclm-adapter"
ONPOLICY_FILES = ("train.jsonl", "data.json")  # what `oven asynclm-onpolicy` writes


def _fail(verb: str, exc: Exception) -> int:
    print(f"oven {verb}: error: {exc}", file=sys.stderr)
    return 1


def _check_out(out: Path, writes: tuple[str, ...], overwrite: bool, again: str = "--overwrite writes over it") -> None:
    """Refuse ``--out`` before any slow work: a file where the folder goes, or a folder holding an
    earlier run's results (``writes``, which this run would replace) unless ``overwrite``."""
    from oven.proto.config_loader import blocking_file

    if (file := blocking_file(out)) is not None:
        raise ValueError(f"--out {out}: {file} is a file, not a folder")
    earlier = [name for name in writes if (out / name).exists()] if not overwrite else []
    if earlier:
        raise ValueError(f"--out {out} holds an earlier run's {', '.join(earlier)}: {again}, or give another --out")


def _add_overwrite_option(parser: argparse.ArgumentParser, what: str = "write over them") -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"where --out holds an earlier run's files, {what} (without it: an error)")


def _add_mix_options(parser: argparse.ArgumentParser) -> None:
    """The options of the training demo tasks' mix (``demo_tasks.TrainingMix``), for every verb that makes them."""
    from .demo_tasks import TRAINING_MIX

    parser.add_argument("--dependent-weight", type=float, default=TRAINING_MIX.dependent_weight,
                        help="weight of each dependent chain kind in training demo tasks (a price in another "
                             "currency, a temperature in Fahrenheit, the cost of shares; evaluation: 1-1.5; "
                             "default %(default)s)")
    parser.add_argument("--made-up", type=float, default=TRAINING_MIX.made_up,
                        help="chance that a training demo task's entity is made up or rare (default %(default)s)")
    parser.add_argument("--contrast", type=float, default=TRAINING_MIX.contrast,
                        help="chance that a training demo task pairs a request with a same-kind one that needs a "
                             "next call: the weather in A and the temperature in B in Fahrenheit (default %(default)s)")
    parser.add_argument("--off-topic", type=float, default=TRAINING_MIX.off_topic,
                        help="chance that a training demo task is a request none of the tools serves, answered "
                             "without a call: a limerick, a synonym (default %(default)s)")


def _command_line(verb: str) -> str | None:
    """``oven VERB ...`` as it was typed, for training.json (None when called as a function, not a verb)."""
    import shlex

    return shlex.join(["oven", *sys.argv[sys.argv.index(verb):]]) if verb in sys.argv else None


def _mix(args: argparse.Namespace):
    """The ``TrainingMix`` that :func:`_add_mix_options`' options ask for (validated by it)."""
    from dataclasses import replace

    from .demo_tasks import TRAINING_MIX

    return replace(TRAINING_MIX, dependent_weight=args.dependent_weight, made_up=args.made_up,
                   contrast=args.contrast, off_topic=args.off_topic)


def add_parsers(sub, default_model: str) -> None:
    from .data import DEFAULT_WEIGHTS, SOURCES, DataConfig
    from .decoder import DECODERS
    from .onpolicy import ROLLOUT_SOURCES

    defaults = DataConfig()
    data = sub.add_parser(
        "asynclm-data", help="write AsyncLM training and evaluation samples (JSONL)",
        description="Simulate AsyncLM interactions (LPT call order, interrupts where the inferlet injects them, "
                    "traps, user follow-ups) on demo-tool tasks and BFCL samples, and write them token-exact "
                    "as the inferlet builds its context: OUT/train.jsonl, OUT/eval.jsonl and OUT/data.json "
                    "(arguments, counts, SHA-256). Evaluation samples use held-out BFCL ids and demo entities.")
    data.add_argument("--out", default=DEFAULT_DATA_DIR, help="output folder (default %(default)s)")
    _add_overwrite_option(data)
    data.add_argument("--seed", type=int, default=defaults.seed, help="default %(default)s")
    data.add_argument("--demo-train", type=int, default=defaults.demo_train, help="demo tasks for training "
                      "(default %(default)s)")
    data.add_argument("--demo-eval", type=int, default=defaults.demo_eval, help="held-out demo tasks "
                      "(default %(default)s)")
    data.add_argument("--parallel-repeats", type=int, default=defaults.parallel_repeats,
                      help="simulations per BFCL parallel/live-parallel training sample (default %(default)s)")
    data.add_argument("--multi-turn-train", type=int, default=defaults.multi_turn_train,
                      help="BFCL multi-turn first turns for training (default %(default)s)")
    data.add_argument("--multi-step-train", type=int, default=defaults.multi_step_train,
                      help="multi-step-parallel compositions of training samples (default %(default)s)")
    data.add_argument("--multi-step-eval", type=int, default=defaults.multi_step_eval,
                      help="held-out multi-step-parallel samples (default %(default)s)")
    data.add_argument("--irrelevance-train", type=int, default=defaults.irrelevance_train,
                      help="BFCL irrelevance and live-irrelevance training entries, each, first in file order "
                           "(default: all)")
    data.add_argument("--mismatched-train", type=int, default=defaults.mismatched_train,
                      help="training tasks that put a BFCL parallel training sample's tools beside another's "
                           "question, answered without a call (default %(default)s)")
    data.add_argument("--variants", default=",".join(f"{k}={v:g}" for k, v in DEFAULT_WEIGHTS.items()),
                      help="weights of the variant a training task gets (evaluation tasks get all three) "
                           "(default %(default)s)")
    data.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="leave longer samples out "
                      "(default %(default)s)")
    data.add_argument("--group", type=int, default=defaults.group, help="training demo tasks sharing one table "
                      "of estimated times, so the trainer forwards their system prompt once (default %(default)s)")
    _add_mix_options(data)
    data.add_argument("--sources", default=",".join(SOURCES), help="which tasks (default %(default)s)")
    data.add_argument("--model", default=default_model, help="whose tokenizer (default %(default)s)")
    data.set_defaults(func=cmd_data)

    train = sub.add_parser(
        "asynclm-train", help="LoRA fine-tuning on AsyncLM samples",
        description="Fine-tune LoRA adapters of the served model on DATA (a train.jsonl of `oven asynclm-data`) "
                    "on the CPU and write a PEFT adapter folder (bf16) with training.json (command, seed, data "
                    "hash, settings, loss curve). Checkpoints every --checkpoint-every steps; --resume goes on, "
                    "--overwrite starts again in an OUT that holds an earlier run.")
    train.add_argument("data", nargs="?", default=f"{DEFAULT_DATA_DIR}/train.jsonl", metavar="DATA",
                       help="training samples (default %(default)s)")
    train.add_argument("--out", default=DEFAULT_ADAPTER_DIR, help="adapter folder (default %(default)s)")
    train.add_argument("--model", default=default_model, help="base model spec (default %(default)s)")
    train.add_argument("--seed", type=int, default=0, help="default %(default)s")
    train.add_argument("--epochs", type=int, default=1, help="default %(default)s")
    train.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default %(default)s)")
    train.add_argument("--warmup-steps", type=int, default=10, help="default %(default)s")
    train.add_argument("--batch-samples", type=int, default=8, help="samples per batch (default %(default)s)")
    train.add_argument("--batch-tokens", type=int, default=3584,
                       help="tokens forwarded per batch (default %(default)s)")
    train.add_argument("--rank", type=int, default=16, help="LoRA rank (default %(default)s)")
    train.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (default %(default)s)")
    train.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj", help="LoRA target modules "
                       "(default %(default)s)")
    train.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                       help="matrix products in bf16 (autocast) or fp32; weights stay fp32; auto: bf16 where the "
                            "CPU has bf16 instructions (AVX-512 BF16, AMX), else fp32 (default %(default)s)")
    train.add_argument("--variants", default="", help="train only on these variants, comma-separated "
                       "(default: all in DATA)")
    train.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    train.add_argument("--checkpoint-every", type=int, default=25, help="steps (default %(default)s)")
    train.add_argument("--max-steps", type=int, default=None,
                       help="stop after this many steps, writing the adapter so far (resumable)")
    train.add_argument("--resume", action="store_true", help="go on from OUT/checkpoint.pt")
    _add_overwrite_option(train, "start again, writing over them")
    train.add_argument("--init", default=None, metavar="ADAPTER",
                       help="start from this adapter folder (an earlier run's OUT) instead of a fresh adapter: "
                            "a second stage on new samples; training.json keeps the earlier run's summary")
    train.add_argument("--call-weight", type=float, default=1.0,
                       help="loss weight of the tokens of the calls the model writes, against 1 for the rest of "
                            "what it writes (default %(default)s)")
    train.add_argument("--reject-weight", type=float, default=0.0,
                       help="on-policy samples (oven asynclm-onpolicy): the loss weight of each token where the "
                            "model was corrected, and of pushing down the token it wrote there instead "
                            "(default %(default)s: corrected tokens weigh as any other)")
    train.set_defaults(func=cmd_train)

    onpolicy = sub.add_parser(
        "asynclm-onpolicy", help="on-policy AsyncLM samples: a fine-tuned model writes, the ideal model corrects",
        description="Run an adapter greedily on new training tasks (--source) inside the simulation; wherever it "
                    "writes a unit (a call, a line, a trap, the end of its turn) the ideal model would not, "
                    "the ideal model's unit replaces it and the adapter goes on (DAgger). Writes OUT/train.jsonl "
                    "(the corrected tasks' samples, --repeat times, plus --replay-samples drawn from --replay) "
                    "and OUT/data.json, for `oven asynclm-train`.")
    onpolicy.add_argument("--adapter", help="the adapter folder that writes (or --rollouts)")
    onpolicy.add_argument("--rollouts", metavar="DIR", help="instead of running an adapter, take the corrected "
                          "samples of an earlier run's OUT (to mix them again with other --repeat or --replay)")
    onpolicy.add_argument("--out", required=True, help="output folder")
    _add_overwrite_option(onpolicy)
    onpolicy.add_argument("--seed", type=int, required=True, help="of the tasks; use one that no data set used")
    onpolicy.add_argument("--tasks", type=int, default=200, help="training tasks (default %(default)s)")
    onpolicy.add_argument("--source", choices=ROLLOUT_SOURCES, default="demo",
                          help="generated demo tasks, BFCL multi-turn first turns (at most 49) or multi-step-"
                               "parallel compositions of three of them (default %(default)s)")
    _add_mix_options(onpolicy)
    onpolicy.add_argument("--exclude", metavar="EVAL_JSONL", help="leave out tasks with these samples' questions")
    onpolicy.add_argument("--repeat", type=int, default=1, help="copies of each corrected sample (default %(default)s)")
    onpolicy.add_argument("--replay", metavar="TRAIN_JSONL", help="ideal samples to mix in (DAgger keeps "
                          "training on the earlier data too)")
    onpolicy.add_argument("--replay-samples", type=int, default=0, help="how many, drawn at random with --seed "
                          "(default %(default)s)")
    onpolicy.add_argument("--decoder", choices=DECODERS, default="engine",
                          help="oven's paged engine, --parallel tasks batched, or transformers + PEFT, one task "
                               "at a time (default %(default)s)")
    onpolicy.add_argument("--parallel", type=int, default=32, help="tasks at once on the engine (default %(default)s)")
    onpolicy.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    onpolicy.add_argument("--model", default=default_model, help="base model spec (default %(default)s)")
    onpolicy.set_defaults(func=cmd_onpolicy)

    soup = sub.add_parser(
        "asynclm-soup", help="average LoRA adapters of one base model into one (a model soup)",
        description="Write the weighted average of the adapters' weight deltas as one PEFT adapter, factored "
                    "again by SVD at --rank (PEFT's add_weighted_adapter). Averaging adapters trained from the "
                    "same starting adapter on different data often scores above each of them. OUT/training.json "
                    "keeps each part's weight, hash and own training.json.")
    soup.add_argument("adapters", nargs="+", metavar="ADAPTER", help="PEFT adapter folders (two or more)")
    soup.add_argument("--out", required=True, help="output folder")
    _add_overwrite_option(soup)
    soup.add_argument("--weights", help="comma-separated, one per adapter (default: all equal, summing to 1)")
    soup.add_argument("--rank", type=int, default=None, help="the soup's LoRA rank (default: the parts' largest)")
    soup.add_argument("--model", default=default_model, help="base model spec (default %(default)s)")
    soup.set_defaults(func=cmd_soup)


def cmd_data(args: argparse.Namespace) -> int:

    from oven.control.tokenizer import Tokenizer
    from oven.inference.models import resolve_model

    from ..tools import ToolError
    from .data import DATA_FILES, DataConfig, build, parse_weights, write
    from .segments import Encoder

    try:
        config = DataConfig(seed=args.seed, demo_train=args.demo_train, demo_eval=args.demo_eval,
                            parallel_repeats=args.parallel_repeats, multi_turn_train=args.multi_turn_train,
                            multi_step_train=args.multi_step_train, multi_step_eval=args.multi_step_eval,
                            irrelevance_train=args.irrelevance_train, mismatched_train=args.mismatched_train,
                            weights=parse_weights(args.variants), max_tokens=args.max_tokens, group=args.group,
                            sources=tuple(s for s in args.sources.split(",") if s),
                            mix=_mix(args))
        _check_out(Path(args.out), DATA_FILES, args.overwrite)
        encoder = Encoder(Tokenizer(resolve_model(args.model).tokenizer))
        evaluation, eval_dropped = build("eval", config, encoder)
        train, train_dropped = build("train", config, encoder, frozenset(r["question"] for r in evaluation))
        too_long = train_dropped["too long"] + eval_dropped["too long"]
        if too_long and not train and not evaluation:
            raise ValueError(f"all {too_long} samples are longer than --max-tokens {args.max_tokens}; nothing written")
    except (ValueError, FileNotFoundError, ModuleNotFoundError, ToolError) as exc:
        return _fail("asynclm-data", exc)
    counts = {}
    for split, records in (("train", train), ("eval", evaluation)):
        for r in records:
            key = f"{split} {r['source']} {r['variant']}"
            counts[key] = counts.get(key, 0) + 1
    tokens = {split: sum(len(r["ids"]) for r in records) for split, records in (("train", train), ("eval", evaluation))}
    meta = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "counts": counts, "tokens": tokens,
            "dropped": {"train": train_dropped, "eval": eval_dropped}}
    sha = write({"train": train, "eval": evaluation}, Path(args.out), meta)
    for key, count in sorted(counts.items()):
        print(f"{key:40} {count:6}")
    print(f"train: {len(train)} samples, {tokens['train']} tokens; eval: {len(evaluation)} samples, "
          f"{tokens['eval']} tokens; left out: train {train_dropped}, eval {eval_dropped}")
    print(f"wrote {args.out}/train.jsonl, {args.out}/eval.jsonl, {args.out}/data.json; sha256 {sha}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import logging

    from .model import LoraSettings
    from .train import CHECKPOINT, OUT_FILES, TrainConfig, train

    logging.basicConfig(level=logging.INFO, format="oven: %(message)s")
    try:
        config = TrainConfig(
            data=Path(args.data), out=Path(args.out), model=args.model, seed=args.seed, epochs=args.epochs,
            lr=args.lr, warmup_steps=args.warmup_steps, batch_samples=args.batch_samples,
            batch_tokens=args.batch_tokens,
            lora=LoraSettings(args.rank, args.alpha, tuple(t for t in args.targets.split(",") if t)),
            precision=args.precision,
            variants=tuple(v for v in args.variants.split(",") if v), threads=_threads(args),
            checkpoint_every=args.checkpoint_every, max_steps=args.max_steps,
            init=Path(args.init) if args.init else None, call_weight=args.call_weight,
            reject_weight=args.reject_weight)
        if args.resume and args.overwrite:
            raise ValueError("--resume goes on from OUT's checkpoint, --overwrite starts again: give one")
        again = "--overwrite starts again"
        if (config.out / CHECKPOINT).is_file():
            again = f"--resume goes on from its {CHECKPOINT}, {again}"
        _check_out(config.out, OUT_FILES, args.overwrite or args.resume, again)
        summary = train(config, resume=args.resume, command=_command_line("asynclm-train"))
    except (ValueError, FileNotFoundError, KeyError) as exc:
        return _fail("asynclm-train", exc)
    print(f"wrote {args.out}/ (adapter_config.json, adapter_model.safetensors, training.json): "
          f"{summary['steps_done']} of {summary['steps']} steps on {summary['samples']} samples in "
          f"{summary['train_seconds']:.0f} s, final loss {summary['final_loss']:.4f}")
    if not summary["complete"]:
        print(f"stopped early: --resume goes on from {args.out}/checkpoint.pt")
    return 0


def _earlier_rollouts(folder: Path) -> tuple[list[dict], dict]:
    """The corrected samples of an earlier ``oven asynclm-onpolicy`` OUT, each once, and its data.json."""
    from .data import read_meta, read_records

    meta, data = read_meta(folder), folder / "train.jsonl"
    if not meta or not data.is_file():
        raise FileNotFoundError(f"{folder}: not an `oven asynclm-onpolicy` output (no data.json and train.jsonl)")
    seen, corrected = set(), []
    for sample in read_records(data):
        if "corrections" in sample and sample["id"] not in seen:
            seen.add(sample["id"])
            corrected.append(sample)
    return corrected, meta


# What only a run that rolls an adapter out uses (recorded from the earlier run under --rollouts).
_ROLLOUT_OPTIONS = ("adapter", "tasks", "source", "dependent_weight", "made_up", "contrast", "off_topic", "exclude",
                    "decoder", "parallel", "threads")


def _threads(args: argparse.Namespace) -> int:
    """``--threads``, or one per core where not given (0 stays 0, for the config to refuse)."""
    import os

    return (os.cpu_count() or 1) if args.threads is None else args.threads


def _read_samples(flag: str, path: str) -> list[dict]:
    """The samples in ``flag``'s file; an error names the flag as well as the file."""
    from .data import read_records

    try:
        return read_records(Path(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{flag}: {exc}") from None


def cmd_onpolicy(args: argparse.Namespace) -> int:
    import random
    import time

    from .data import write
    from .onpolicy import OnPolicyConfig, collect

    started = time.monotonic()

    def progress(done: int, total: int, task_id: str, corrections: list[dict]) -> None:
        eta = (time.monotonic() - started) / done * (total - done)
        print(f"\r[{done}/{total}, ETA {eta / 60:.0f} min] {task_id}: {len(corrections)} corrections   ",
              end="" if done < total else "\n", file=sys.stderr, flush=True)
    try:
        if args.repeat < 1 or args.replay_samples < 0 or (args.replay_samples and not args.replay):
            raise ValueError("--repeat must be >= 1, --replay-samples >= 0, and --replay-samples needs --replay")
        if (args.adapter is None) == (args.rollouts is None):
            raise ValueError("give either --adapter (run it) or --rollouts (an earlier run's samples)")
        _check_out(Path(args.out), ONPOLICY_FILES, args.overwrite)
        written = (Path(args.out) / "train.jsonl").resolve()
        reads = [args.replay, args.exclude, args.rollouts and str(Path(args.rollouts) / "train.jsonl")]
        if written in {Path(r).resolve() for r in reads if r}:
            raise ValueError(f"--out {args.out}: this run reads its train.jsonl; give another --out")
        replay = _read_samples("--replay", args.replay) if args.replay else []
        if args.replay_samples > len(replay):
            raise ValueError(f"--replay-samples {args.replay_samples}: {args.replay} holds {len(replay)} samples")
        if args.rollouts:
            corrected, earlier = _earlier_rollouts(Path(args.rollouts))
            num_tasks = earlier["counts"]["tasks"]
        else:
            config = OnPolicyConfig(
                adapter=Path(args.adapter), seed=args.seed, tasks=args.tasks, source=args.source, model=args.model,
                mix=_mix(args), decoder=args.decoder, parallel=args.parallel,
                threads=_threads(args),
                exclude=frozenset(r["question"] for r in _read_samples("--exclude", args.exclude)) if args.exclude
                else frozenset())
            corrected, num_tasks = collect(config, progress)
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as exc:
        return _fail("asynclm-onpolicy", exc)
    drawn = random.Random(f"{args.seed}:replay").sample(replay, args.replay_samples)
    samples = [s for s in corrected for _ in range(args.repeat)] + drawn
    counts = {"tasks": num_tasks, "corrected": len(corrected),
              "corrections": sum(len(s["corrections"]) for s in corrected), "replayed": len(drawn)}
    recorded = {k: v for k, v in vars(args).items() if k != "func"}
    if args.rollouts:  # the rollouts' own options are the earlier run's; its args say what they were
        recorded = {k: v for k, v in recorded.items() if k not in _ROLLOUT_OPTIONS} | {"rollouts_of": earlier["args"]}
    meta = {"args": recorded, "counts": counts}
    sha = write({"train": samples}, Path(args.out), meta)
    print(f"{counts['corrected']} of {num_tasks} tasks corrected ({counts['corrections']} units); wrote "
          f"{len(samples)} samples to {args.out}/train.jsonl ({counts['replayed']} replayed); sha256 {sha}")
    return 0


def cmd_soup(args: argparse.Namespace) -> int:
    from .soup import SoupConfig, make_soup
    from .train import ADAPTER_FILES

    try:
        try:
            weights = tuple(float(w) for w in args.weights.split(",")) if args.weights else ()
        except ValueError:
            raise ValueError(f"--weights {args.weights}: expected numbers separated by commas") from None
        config = SoupConfig(parts=tuple(Path(a) for a in args.adapters), out=Path(args.out), model=args.model,
                            weights=weights, rank=args.rank)
        _check_out(config.out, ADAPTER_FILES, args.overwrite)
        record = make_soup(config, command=_command_line("asynclm-soup"))
    except (ValueError, FileNotFoundError, KeyError, ModuleNotFoundError) as exc:
        return _fail("asynclm-soup", exc)
    print(f"wrote {args.out}/ (adapter_config.json, adapter_model.safetensors, training.json): rank "
          f"{record['rank']}, weights " + ", ".join(f"{p['name']} {p['weight']:g}" for p in record["parts"]))
    return 0
