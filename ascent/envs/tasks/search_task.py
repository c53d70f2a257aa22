"""Search QA: a generated encyclopedia of made-up places and people, questions only it answers, and the
`search_qa` environment.

`make_search_task(out_dir, n_rows, seed)` writes `<out_dir>/corpus.jsonl` (one short document a line: a
country, city, river, mountain or person with its attributes, "The river Olvan flows through Tarsk and is
412 km long."), its BM25 index `index.db` (`SearchIndex`), and `rows.jsonl` / `val.jsonl`: questions that
need one document (`hops: 1`, "How long is the river Olvan, in km?") or two, the first naming the entity the
second describes (`hops: 2`, "In which country is the city that the river Olvan flows through?"); `docs`
lists the titles needed. The names are made up, so a model cannot answer from memory.
Command line: `python -m ascent.envs.tasks.search_task OUT --rows 400 --seed 0 [--shape skyrl]`.

`SearchQa` (`env: search_qa`) gives the model a `search(query)` tool over the row's index (`index_path`, a
column or SkyRL's `extra_info.index_path`) and scores the final answer with `answer_matches`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascent.envs.agent import ToolEnv, answer_matches
from ascent.envs.base import Message
from ascent.envs.rows import row_field
from ascent.envs.tasks.common import (
    FIRST_NAMES,
    LAST_NAMES,
    Shape,
    interleave,
    made_up_names,
    main,
    n_val_rows,
    person_names,
    write_split,
)
from ascent.envs.tools import SearchIndex, ToolResult, function_tool

N_COUNTRIES, N_CITIES, N_RIVERS, N_MOUNTAINS, N_PEOPLE = 10, 60, 30, 20, 60
OCCUPATIONS = (
    "painter",
    "astronomer",
    "composer",
    "sculptor",
    "engineer",
    "poet",
    "cartographer",
    "physician",
    "architect",
    "botanist",
    "weaver",
    "historian",
)
DOCS = {
    "country": "{name} is a country whose capital is {capital}. Its currency is the {currency}.",
    "city": "{name} is a city in {country}. It was founded in {founded} and has {population:,} inhabitants.",
    "river": "The river {name} flows through {city} and is {length} km long.",
    "mountain": "{name} rises {height} metres above the sea in {country}.",
    "person": "{name} was {article} {occupation} born in {city} in {born}.",
}
# (kind, template name, question, answer attribute, hops: the attribute naming the second document's entity)
QUESTIONS = (
    ("river", "river_length", "How long is the river {name}, in km?", "length", None),
    ("river", "river_city", "Which city does the river {name} flow through?", "city", None),
    ("city", "city_country", "In which country is the city {name}?", "country", None),
    ("city", "city_founded", "In what year was the city {name} founded?", "founded", None),
    ("city", "city_population", "How many inhabitants does the city {name} have?", "population", None),
    ("person", "person_occupation", "What was the occupation of {name}?", "occupation", None),
    ("person", "person_born", "In what year was {name} born?", "born", None),
    ("mountain", "mountain_height", "How high is {name}, in metres?", "height", None),
    ("country", "country_capital", "What is the capital of {name}?", "capital", None),
    ("country", "country_currency", "What is the currency of {name}?", "currency", None),
    (
        "river",
        "river_country",
        "In which country is the city that the river {name} flows through?",
        "country",
        "city",
    ),
    (
        "river",
        "river_city_population",
        "How many inhabitants does the city on the river {name} have?",
        "population",
        "city",
    ),
    ("person", "person_country", "In which country was {name} born?", "country", "city"),
    (
        "person",
        "person_city_founded",
        "In what year was the birthplace of {name} founded?",
        "founded",
        "city",
    ),
    (
        "mountain",
        "mountain_capital",
        "What is the capital of the country where {name} rises?",
        "capital",
        "country",
    ),
)


@dataclass(frozen=True)
class Entity:
    kind: str
    name: str
    attrs: dict[str, Any]

    def text(self) -> str:
        return DOCS[self.kind].format(name=self.name, **self.attrs)


def make_world(rng: random.Random) -> dict[str, Entity]:
    """The made-up entities by name: countries, their cities (each country's capital among them), the rivers
    through the cities, mountains in the countries, people born in the cities."""
    vocabulary = " ".join(
        [*DOCS.values(), *(q[2] for q in QUESTIONS), *OCCUPATIONS, *FIRST_NAMES, *LAST_NAMES]
    )
    avoid = "".join(c if c.isalnum() else " " for c in vocabulary).split()
    names = iter(made_up_names(rng, N_COUNTRIES * 2 + N_CITIES + N_RIVERS + N_MOUNTAINS, avoid))
    countries = [next(names) for _ in range(N_COUNTRIES)]
    cities = [
        Entity(
            "city",
            next(names),
            {
                "country": countries[i] if i < N_COUNTRIES else rng.choice(countries),
                "founded": rng.randint(800, 1900),
                "population": 100 * rng.randint(50, 9000),
            },
        )
        for i in range(N_CITIES)
    ]
    world = {c.name: c for c in cities}
    for country in countries:
        capital = rng.choice([c.name for c in cities if c.attrs["country"] == country])
        world[country] = Entity("country", country, {"capital": capital, "currency": next(names).lower()})
    for _ in range(N_RIVERS):
        river = Entity(
            "river", next(names), {"city": rng.choice(cities).name, "length": rng.randint(40, 1800)}
        )
        world[river.name] = river
    for _ in range(N_MOUNTAINS):
        mountain = f"Mount {next(names)}"
        attrs = {"country": rng.choice(countries), "height": rng.randint(800, 5200)}
        world[mountain] = Entity("mountain", mountain, attrs)
    for person in person_names(rng, N_PEOPLE):
        job = rng.choice(OCCUPATIONS)
        attrs = {
            "occupation": job,
            "article": "an" if job[0] in "aeiou" else "a",
            "city": rng.choice(cities).name,
            "born": rng.randint(1700, 1990),
        }
        world[person] = Entity("person", person, attrs)
    return world


def _question(world: dict[str, Entity], e: Entity, question: tuple[Any, ...], index: Path) -> dict[str, Any]:
    _, template, text, attr, bridge = question
    last = world[e.attrs[bridge]] if bridge else e
    return {
        "prompt": text.format(name=e.name),
        "answer": last.attrs[attr],
        "env": "search_qa",
        "index_path": index.name,  # relative to the rows file, beside it
        "hops": 2 if bridge else 1,
        "docs": [e.name, last.name] if bridge else [e.name],
        "template": template,
    }


def make_search_task(
    out_dir: str | Path, n_rows: int, seed: int = 0, *, n_val: int | None = None, shape: Shape = "ascent"
) -> Path:
    """Write `corpus.jsonl`, `index.db`, `rows.jsonl` (`n_rows` questions) and `val.jsonl` (`n_val`, default a
    tenth, other questions) to `out_dir`; return the path of `rows.jsonl`. Rows name the index
    relative to themselves (`ascent.data.load_rows` resolves it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    world = make_world(rng)
    docs = [(e.name, e.text()) for e in world.values()]
    with open(out / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps({"title": t, "text": x}) + "\n" for t, x in docs)
    index = out / "index.db"
    SearchIndex.build(index, docs)
    wanted = n_rows + n_val_rows(n_rows, n_val)
    pools = [[(e, q) for e in world.values() if e.kind == q[0]] for q in QUESTIONS]
    rows = [
        _question(world, e, q, index)
        for (e, q), _ in zip(interleave(rng, pools), range(wanted), strict=False)
    ]
    return write_split(out, rng, rows, n_rows, wanted, shape, ("corpus", "corpora"))


SYSTEM = (
    "Answer the question with the search tool: it searches an encyclopedia of made-up places and people, "
    "which you cannot know otherwise. Search as often as you need. When you know the answer, reply with it "
    "alone inside <answer></answer>, for example <answer>1492</answer>."
)


class SearchQa(ToolEnv):
    """`search(query)` over the row's `index_path`; `answer_matches` scores the final answer."""

    def __init__(self) -> None:
        super().__init__([function_tool(self.search)], answer_matches, SYSTEM)

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        path = Path(str(row_field(row, "index_path")))
        if not path.is_file():
            raise FileNotFoundError(
                f"index_path {str(path)!r}: no such index (write one: python -m "
                "ascent.envs.tasks.search_task OUT)"
            )
        self.index = SearchIndex(path)
        return super().reset(row)

    def search(self, query: str) -> ToolResult:
        """Search the encyclopedia: the 3 passages that best match the query's words, best first, each after
        its title in brackets."""
        return self.index.search(query, k=3)


if __name__ == "__main__":
    main(make_search_task, "Write a generated encyclopedia, its search index and questions about it.")
