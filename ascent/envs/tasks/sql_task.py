"""Text-to-SQL: a generated shop database, questions about it, and the `text_to_sql` environment.

`make_sql_task(out_dir, n_rows, seed)` writes `<out_dir>/shop.db` (SQLite: customers, products, orders; a few
hundred rows drawn from a seeded RNG) and `rows.jsonl` / `val.jsonl`: questions from ten templates of three
levels (1: one table; 2: a join or a date; 3: sums of quantity times price, rankings), each row's `answer`
computed by running its reference query (`sql`) on the database; questions whose ranking ties are left out.
Command line: `python -m ascent.envs.tasks.sql_task OUT --rows 400 --seed 0 [--shape skyrl]`.

`TextToSql` (`env: text_to_sql`) gives the model the schema in the system message and a `sql(query)` tool on
the row's database (`db_path`, a column or SkyRL's `extra_info.db_path`; read-only, bounded: `run_sql`), so
one run can mix databases; a bad query is answered with SQLite's error and the episode goes on. The final
answer is scored by `answer_matches` (numbers numerically, names normalised).
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from ascent.envs.agent import ToolEnv, answer_matches
from ascent.envs.base import Message
from ascent.envs.rows import row_field
from ascent.envs.tasks.common import Shape, interleave, main, n_val_rows, person_names, write_split
from ascent.envs.tools import ToolResult, function_tool, run_sql

CITIES = ("Lisbon", "Oslo", "Porto", "Riga", "Turin", "Ghent", "Bergen", "Lyon")
CATEGORIES = {
    "kitchen": ("Kettle", "Pan", "Knife", "Mug", "Bowl", "Whisk"),
    "garden": ("Rake", "Hose", "Shovel", "Planter", "Lantern", "Sprinkler"),
    "office": ("Stapler", "Notebook", "Lamp", "Chair", "Pen", "Folder"),
    "toys": ("Kite", "Puzzle", "Robot", "Drum", "Yoyo", "Marbles"),
    "sports": ("Ball", "Racket", "Helmet", "Bottle", "Glove", "Mat"),
}
ADJECTIVES = ("Copper", "Blue", "Classic", "Compact", "Deluxe", "Tiny", "Sturdy", "Bright", "Silver", "Green")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
STATUSES, STATUS_WEIGHTS = ("delivered", "shipped", "cancelled"), (7, 2, 1)
N_CUSTOMERS, N_PRODUCTS, N_ORDERS = 80, 30, 600

SCHEMA = (
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, joined DATE)",
    "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), "
    "product_id INTEGER REFERENCES products(id), quantity INTEGER, order_date DATE, status TEXT)",
)
_BY_CUSTOMER = "orders JOIN customers ON customers.id = orders.customer_id"
_BY_PRODUCT = "orders JOIN products ON products.id = orders.product_id"
_PRICE = "counting quantity times unit price and leaving out cancelled orders"


@dataclass(frozen=True)
class Shop:
    """What the questions are drawn from (the values in the database)."""

    cities: Sequence[str]
    customers: Sequence[str]
    products: Sequence[str]
    categories: Sequence[str]


@dataclass(frozen=True)
class Template:
    """A question and its reference query, both filled from one parameter set. `ranked`: the query lists
    candidates best first with their score in the second column; the first is the answer unless it ties."""

    name: str
    level: int
    question: str
    sql: str
    params: Callable[[Shop], list[dict[str, str]]]
    ranked: bool = False


def _each(key: str, pick: Callable[[Shop], Sequence[str]]) -> Callable[[Shop], list[dict[str, str]]]:
    return lambda shop: [{key: v} for v in pick(shop)]


def _months(shop: Shop) -> list[dict[str, str]]:
    return [{"month": m, "mm": f"{i + 1:02d}"} for i, m in enumerate(MONTHS)]


TEMPLATES = (
    Template(
        "customers_in_city",
        1,
        "How many customers live in {city}?",
        "SELECT COUNT(*) FROM customers WHERE city = {city}",
        _each("city", lambda s: s.cities),
    ),
    Template(
        "product_price",
        1,
        "What is the price of the product {product}?",
        "SELECT price FROM products WHERE name = {product}",
        _each("product", lambda s: s.products),
    ),
    Template(
        "orders_of_customer",
        2,
        "How many orders did the customer {customer} place?",
        f"SELECT COUNT(*) FROM {_BY_CUSTOMER} WHERE customers.name = {{customer}}",
        _each("customer", lambda s: s.customers),
    ),
    Template(
        "units_of_product",
        2,
        "How many units of {product} were ordered in total?",
        f"SELECT COALESCE(SUM(orders.quantity), 0) FROM {_BY_PRODUCT} WHERE products.name = {{product}}",
        _each("product", lambda s: s.products),
    ),
    Template(
        "cancelled_in_month",
        2,
        "How many orders placed in {month} 2024 were cancelled?",
        "SELECT COUNT(*) FROM orders WHERE status = 'cancelled' AND strftime('%m', order_date) = {mm}",
        _months,
    ),
    Template(
        "product_orders_from_city",
        2,
        "How many orders of {product} came from customers living in {city}?",
        f"SELECT COUNT(*) FROM {_BY_CUSTOMER} JOIN products ON products.id = orders.product_id "
        "WHERE products.name = {product} AND customers.city = {city}",
        lambda s: [{"product": p, "city": c} for p in s.products for c in s.cities],
    ),
    Template(
        "revenue_in_month",
        3,
        f"What is the total price of the orders placed in {{month}} 2024, {_PRICE}?",
        f"SELECT ROUND(COALESCE(SUM(orders.quantity * products.price), 0), 2) FROM {_BY_PRODUCT} "
        "WHERE strftime('%m', orders.order_date) = {mm} AND orders.status != 'cancelled'",
        _months,
    ),
    Template(
        "spent_by_customer",
        3,
        f"How much did the customer {{customer}} spend in total, {_PRICE}?",
        f"SELECT ROUND(COALESCE(SUM(orders.quantity * products.price), 0), 2) FROM {_BY_CUSTOMER} "
        "JOIN products ON products.id = orders.product_id "
        "WHERE customers.name = {customer} AND orders.status != 'cancelled'",
        _each("customer", lambda s: s.customers),
    ),
    Template(
        "top_customer_in_category",
        3,
        "Which customer bought the most units of {category} products?",
        f"SELECT customers.name, SUM(orders.quantity) AS units FROM {_BY_CUSTOMER} JOIN products ON "
        "products.id = orders.product_id WHERE products.category = {category} GROUP BY customers.id "
        "ORDER BY units DESC",
        _each("category", lambda s: s.categories),
        ranked=True,
    ),
    Template(
        "top_product_in_month",
        3,
        "Which product sold the most units in {month} 2024?",
        f"SELECT products.name, SUM(orders.quantity) AS units FROM {_BY_PRODUCT} WHERE "
        "strftime('%m', orders.order_date) = {mm} GROUP BY products.id ORDER BY units DESC",
        _months,
        ranked=True,
    ),
)


def make_shop(path: Path, rng: random.Random) -> Shop:
    """Write the shop database to `path` (replacing one that is there); return what questions draw from."""
    customers = person_names(rng, N_CUSTOMERS)
    kinds = [(a, noun, cat) for cat, nouns in CATEGORIES.items() for noun in nouns for a in ADJECTIVES]
    products = rng.sample(kinds, N_PRODUCTS)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        for statement in SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO customers VALUES (?, ?, ?, ?)",
            [
                (i + 1, name, rng.choice(CITIES), str(date(2023, 1, 1) + timedelta(rng.randrange(365))))
                for i, name in enumerate(customers)
            ],
        )
        conn.executemany(
            "INSERT INTO products VALUES (?, ?, ?, ?)",
            [
                (i + 1, f"{a} {noun}", cat, round(rng.uniform(2, 150), 2))
                for i, (a, noun, cat) in enumerate(products)
            ],
        )
        conn.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    i + 1,
                    rng.randint(1, N_CUSTOMERS),
                    rng.randint(1, N_PRODUCTS),
                    rng.randint(1, 5),
                    str(date(2024, 1, 1) + timedelta(rng.randrange(366))),
                    rng.choices(STATUSES, STATUS_WEIGHTS)[0],
                )
                for i in range(N_ORDERS)
            ],
        )
    conn.close()
    return Shop(sorted(CITIES), customers, [f"{a} {noun}" for a, noun, _ in products], sorted(CATEGORIES))


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _question(
    conn: sqlite3.Connection, t: Template, params: dict[str, str], db: Path
) -> dict[str, Any] | None:
    """The row of one template and parameter set; None when a ranking ties (no single right answer)."""
    sql = t.sql.format(**{k: _literal(v) for k, v in params.items()})
    found = conn.execute(sql).fetchall()
    if not found or (t.ranked and len(found) > 1 and found[0][1] == found[1][1]):
        return None
    return {
        "prompt": t.question.format(**params),
        "answer": found[0][0],
        "env": "text_to_sql",
        "db_path": db.name,  # relative to the rows file, beside it
        "sql": sql,
        "template": t.name,
        "level": t.level,
        "params": params,
    }


def make_sql_task(
    out_dir: str | Path, n_rows: int, seed: int = 0, *, n_val: int | None = None, shape: Shape = "ascent"
) -> Path:
    """Write `shop.db`, `rows.jsonl` (`n_rows` questions) and `val.jsonl` (`n_val`, default a tenth, other
    questions) to `out_dir`; return the path of `rows.jsonl`. Rows name the database
    relative to themselves (`ascent.data.load_rows` resolves it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    db = out / "shop.db"
    shop = make_shop(db, rng)
    wanted = n_rows + n_val_rows(n_rows, n_val)
    pools = [[(t, p) for p in t.params(shop)] for t in TEMPLATES]
    rows: list[dict[str, Any]] = []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for t, params in interleave(rng, pools):
            row = _question(conn, t, params, db)
            rows += [row] if row else []
            if len(rows) == wanted:
                break
    conn.close()
    return write_split(out, rng, rows, n_rows, wanted, shape, ("shop", "shops"))


SYSTEM = (
    "Answer the question about the SQLite database whose tables are below. Call the sql tool to run "
    "read-only queries, as many as you need. When you know the answer, reply with it alone inside "
    "<answer></answer>, for example <answer>42</answer>."
)


class TextToSql(ToolEnv):
    """`sql(query)` on the row's `db_path`; the schema in the system message; `answer_matches` scores."""

    def __init__(self) -> None:
        super().__init__([function_tool(self.sql)], answer_matches, SYSTEM)

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        self.db = Path(str(row_field(row, "db_path")))
        if not self.db.is_file():
            raise FileNotFoundError(
                f"db_path {str(self.db)!r}: no such database (write one: python -m "
                "ascent.envs.tasks.sql_task OUT)"
            )
        return super().reset(row)

    def system_prompt(self, row: Mapping[str, Any]) -> str:
        tables = run_sql(self.db, "SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name")
        if not tables.ok:
            raise RuntimeError(f"db_path {str(self.db)!r}: cannot read its tables ({tables.error})")
        return SYSTEM + "\n\n" + "\n".join(tables.output.splitlines()[1:])

    def sql(self, query: str) -> ToolResult:
        """Run one read-only SQLite query on the database; returns its rows as text (at most 50)."""
        return run_sql(self.db, query)


if __name__ == "__main__":
    main(make_sql_task, "Write a generated shop database and text-to-SQL questions about it.")
