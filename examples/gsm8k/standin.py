"""A GSM8K-format stand-in, generated here: word problems from templates, each answer a worked solution with
GSM8K's calculator annotations (<<12*3=36>>) and the final answer after "####", saved with save_to_disk as a
train / test DatasetDict, the layout ``prepare.py`` reads from ``openai/gsm8k``.

It lets the recipe run end to end where the hub is out of reach (CI, an offline machine): same columns
(``question``, ``answer``), same answer format, easier problems. It is not GSM8K, and numbers measured on it say
nothing about GSM8K.

    python examples/gsm8k/standin.py data/gsm8k-standin [--train 512] [--test 128] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable

NAMES = ("Ava", "Ben", "Carla", "Dev", "Elif", "Femi", "Grace", "Hiro", "Ines", "Jonah", "Kira", "Luis")
ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "shells", "stamps", "cards", "eggs")


def _calc(expression: str, value: int) -> str:
    return f"{expression} = <<{expression.replace(' ', '')}={value}>>{value}"


def _buy_more(r: random.Random) -> tuple[str, list[str], int]:
    name, item, a, b = r.choice(NAMES), r.choice(ITEMS), r.randint(2, 60), r.randint(2, 60)
    question = f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?"
    return question, [f"{name} has {_calc(f'{a} + {b}', a + b)} {item}."], a + b


def _give_away(r: random.Random) -> tuple[str, list[str], int]:
    name, item, b = r.choice(NAMES), r.choice(ITEMS), r.randint(2, 40)
    a = b + r.randint(1, 60)
    question = f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?"
    return question, [f"{name} has {_calc(f'{a} - {b}', a - b)} {item} left."], a - b


def _boxes(r: random.Random) -> tuple[str, list[str], int]:
    item, a, b = r.choice(ITEMS), r.randint(2, 12), r.randint(2, 15)
    question = f"A box holds {a} {item}. How many {item} are there in {b} boxes?"
    return question, [f"{b} boxes hold {_calc(f'{a} * {b}', a * b)} {item}."], a * b


def _share(r: random.Random) -> tuple[str, list[str], int]:
    item, each, people = r.choice(ITEMS), r.randint(2, 12), r.randint(2, 9)
    total = each * people
    question = f"{total} {item} are shared equally among {people} children. How many {item} does each child get?"
    return question, [f"Each child gets {_calc(f'{total} / {people}', each)} {item}."], each


def _wage(r: random.Random) -> tuple[str, list[str], int]:
    name, rate, hours = r.choice(NAMES), r.randint(8, 25), r.randint(2, 9)
    spent = r.randint(1, rate * hours - 1)
    earned = rate * hours
    question = (
        f"{name} earns ${rate} an hour and works for {hours} hours. Then {name} spends ${spent} on lunch. "
        f"How many dollars does {name} have left?"
    )
    steps = [
        f"{name} earns {_calc(f'{rate} * {hours}', earned)} dollars.",
        f"After lunch {name} has {_calc(f'{earned} - {spent}', earned - spent)} dollars.",
    ]
    return question, steps, earned - spent


def _two_shops(r: random.Random) -> tuple[str, list[str], int]:
    item, a, b, price = r.choice(ITEMS), r.randint(2, 20), r.randint(2, 20), r.randint(2, 9)
    question = (
        f"A shop sells {item} for ${price} each. Mia buys {a} and Noor buys {b}. How many dollars do they spend "
        "together?"
    )
    count = a + b
    steps = [
        f"They buy {_calc(f'{a} + {b}', count)} {item}.",
        f"They spend {_calc(f'{count} * {price}', count * price)} dollars.",
    ]
    return question, steps, count * price


def _weeks(r: random.Random) -> tuple[str, list[str], int]:
    name, per_day, weeks = r.choice(NAMES), r.randint(2, 15), r.randint(1, 4)
    days = 7 * weeks
    question = f"{name} reads {per_day} pages every day. How many pages does {name} read in {weeks} weeks?"
    steps = [
        f"{weeks} weeks have {_calc(f'7 * {weeks}', days)} days.",
        f"{name} reads {_calc(f'{per_day} * {days}', per_day * days)} pages.",
    ]
    return question, steps, per_day * days


TEMPLATES: tuple[Callable[[random.Random], tuple[str, list[str], int]], ...] = (
    _buy_more,
    _give_away,
    _boxes,
    _share,
    _wage,
    _two_shops,
    _weeks,
)


def problems(n: int, seed: int) -> list[dict]:
    """``n`` distinct problems as GSM8K rows: ``question`` and ``answer`` (the solution, then ``#### <number>``)."""
    r, rows, seen = random.Random(seed), [], set()
    while len(rows) < n:
        question, steps, value = r.choice(TEMPLATES)(r)
        if question not in seen:
            seen.add(question)
            rows.append({"question": question, "answer": "\n".join([*steps, f"#### {value}"])})
    return rows


def build(out: str, n_train: int = 512, n_test: int = 128, seed: int = 0) -> dict[str, int]:
    """Write the stand-in to ``out`` (DatasetDict.save_to_disk: out/train, out/test); no question is in both."""
    import datasets

    rows = problems(n_train + n_test, seed)
    splits = {"train": rows[:n_train], "test": rows[n_train:]}
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(out)
    return {k: len(v) for k, v in splits.items()}


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to write (DatasetDict.save_to_disk)")
    parser.add_argument("--train", type=int, default=512, help="training problems")
    parser.add_argument("--test", type=int, default=128, help="test problems")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = build(args.out, args.train, args.test, args.seed)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v} problems" for k, v in sizes.items()))
    return sizes


if __name__ == "__main__":
    main()
