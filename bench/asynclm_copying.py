"""Can the model copy a name from the question into its call? By kind of name, base against adapter.

The held-out demo tasks fail most often on a misspelt name (``get_weather(city="Zurkle")`` for
"Zurich"). This bench asks why. It takes the first held-out async demo sample with one
``get_weather`` call (and one with one ``get_stock_price`` call). It swaps each name below into the
question, forwards the context up to ``city="`` (``symbol="``), and lets the model finish the
argument greedily. A name counts as copied if the argument, read as ``parse_call`` reads it (one
opening space dropped), is exactly that name.

* **held-out**: the evaluation entities (``split.json``), which no training sample names.
* **training**: the training pool's real names.
* **made-up**: names drawn fresh (``--seed``) from the training samples' generator (``names.py``;
  random syllables and letters), so almost surely none a training sample used, built the same way.

A real city such as " Zurich" is one token in the question. Right after a quote the call has to
spell it as ``Z``, ``ur``, ``ich``; made-up names are several tokens in both places. An adapter
trained on ``city="Zurich"`` copied made-up names but misspelt held-out ones: it had learned to
copy, not to spell tokens it never spelled in training. So the trained form opens each string
argument with a space (``city=" Zurich"``, ``tools/call.py``), and the name is the question's token.

    .venv/bin/python bench/asynclm_copying.py                 # base and the shipped adapter, ~8 min on 2 cores
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import SHIPPED_ADAPTER, doc_parser, markdown_table, shown_path, write_results  # noqa: E402

from oven.client.asynclm.tools import ToolError, parse_call  # noqa: E402
from oven.client.asynclm.training.check import greedy  # noqa: E402
from oven.client.asynclm.training.decoder import TransformersDecoder  # noqa: E402
from oven.client.asynclm.training.data import DataConfig, build  # noqa: E402
from oven.client.asynclm.training.names import NameMaker, Words  # noqa: E402
from oven.client.asynclm.training.segments import Encoder  # noqa: E402
from oven.client.asynclm.training.split import demo_pools  # noqa: E402

CALLS = {"city": 'get_weather(city="', "symbol": 'get_stock_price(symbol="'}


def context(encoder: Encoder, records: list[dict], arg: str, call: str) -> tuple[str, str]:
    """The text of the first async one-call sample that makes ``call``, up to its argument, and its name."""
    for record in records:
        if record["variant"] == "async" and len(record["calls"]) == 1 and record["calls"][0].startswith(call):
            text = encoder.decode(record["ids"])
            return text[:text.index(call) + len(call)], parse_call(record["calls"][0]).kwargs[arg]
    raise SystemExit(f"no held-out sample with one {call}...) call")


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--adapter", type=Path, default=SHIPPED_ADAPTER,
                        help="PEFT adapter folder (default: the one that ships with oven)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="default %(default)s")
    parser.add_argument("--made-up", type=int, default=45, help="made-up names of each kind (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="for the made-up names (default %(default)s)")
    args = parser.parse_args()
    if not (args.adapter / "adapter_config.json").is_file():
        parser.error(f"--adapter {args.adapter}: no adapter_config.json there")

    import torch

    from oven.client.asynclm.training.model import load_base, with_adapter
    from oven.control.tokenizer import Tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    base, source = load_base(args.model, 0)
    encoder = Encoder(Tokenizer(source.tokenizer))
    records, _ = build("eval", DataConfig(demo_train=0, sources=("demo",)), encoder)
    held, training = demo_pools("eval", ()), demo_pools("train", ())
    maker = NameMaker(random.Random(args.seed), Words((), ()), set(held.cities + held.symbols + training.cities
                                                                   + training.symbols))
    names = {
        ("city", "held-out"): held.cities, ("city", "training"): training.cities,
        ("city", "made-up"): tuple(maker.city() for _ in range(args.made_up)),
        ("symbol", "held-out"): held.symbols, ("symbol", "training"): training.symbols,
        ("symbol", "made-up"): tuple(maker.symbol() for _ in range(args.made_up)),
    }
    contexts = {arg: context(encoder, records, arg, call) for arg, call in CALLS.items()}
    quote = set(encoder.encode('"') + encoder.encode('")'))

    model = with_adapter(base, args.adapter)
    decoder = TransformersDecoder(model)
    rows, misses = [], []
    for model_name in ("base", "adapter"):
        for (arg, kind), pool in names.items():
            text, original = contexts[arg]
            copied = 0
            for name in pool:
                ids = encoder.encode(text.replace(original, name))
                with model.disable_adapter() if model_name == "base" else contextlib.nullcontext():
                    written = encoder.decode(greedy(decoder.session(), ids, 8, quote)).split('"')[0]
                with contextlib.suppress(ToolError):
                    written = parse_call(f'{CALLS[arg]}{written}")').kwargs[arg]
                copied += written == name
                if written != name:
                    misses.append(f"{model_name}, {kind} {arg}: {name} → {written}")
            rows.append([model_name, f"{kind} {arg}", f"{copied}/{len(pool)}", f"{100 * copied / len(pool):.0f} %"])
            print(" ".join(rows[-1]), file=sys.stderr, flush=True)
    sections = [
        f"Adapter `{shown_path(args.adapter)}`; "
        f"model `{args.model}`; greedy; contexts: the first held-out async demo samples with one call.",
        "## Names copied exactly into the call\n\n" + markdown_table(["model", "names", "copied", "share"], rows),
        "## Misses\n\n" + ("\n".join(f"- {m}" for m in misses) or "none"),
    ]
    path = write_results("asynclm_copying", "Copying names into calls, by kind of name", sections)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
