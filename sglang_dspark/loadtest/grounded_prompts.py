"""The load test's grounded set: prompts that hold a passage and a task whose answer copies from it.

Editing code, fixing a typo, turning a CSV into a Markdown table, quoting the sentence that says X: the answer's
material is in the prompt, which is what prompt lookup and n-gram speculation exploit (and what the chat set, whose
answers are free text, does not show). Passages are code (Python, JavaScript, SQL, a JSON config), prose (notes, an
email), lists and tables (Markdown, CSV), composed here from seeded templates and small data banks (no download, no
data set); tasks are edit, fix, annotate, reformat, extract, answer and continue.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Callable

PASSAGE_KINDS = ("code", "prose", "list", "table")
TASK_KINDS = ("edit", "fix", "annotate", "reformat", "extract", "answer", "continue")
PASSAGES_PER_FORM = 32  # 8 forms x 32 passages x 5-6 tasks: about 1 440 prompts (two default sweeps need 1 024)


@dataclass(frozen=True)
class GroundedPrompt:
    """One prompt: ``text`` contains ``passage`` verbatim and a task of ``task_kind`` that draws on it."""

    passage_kind: str  # one of PASSAGE_KINDS
    task_kind: str  # one of TASK_KINDS
    passage: str
    text: str


_NAMES = ["Amara", "Bilal", "Chen", "Dalia", "Emil", "Farah", "Goran", "Hana", "Idris", "Jonas", "Keiko", "Luca",
          "Maya", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tomas", "Uma", "Vera", "Wei", "Yusuf", "Zofia"]
_SURNAMES = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Novak", "Haddad", "Costa", "Fischer", "Kowalski", "Reyes",
             "Ivanova", "Mensah", "Brennan", "Sato", "Weber"]
_CITIES = ["Lisbon", "Nairobi", "Osaka", "Tallinn", "Quito", "Lyon", "Perth", "Krakow", "Austin", "Porto", "Seoul",
           "Cork"]
_PRODUCTS = ["desk lamp", "notebook", "water bottle", "headphones", "backpack", "umbrella", "coffee grinder",
             "yoga mat", "bike light", "phone stand", "kettle", "rain jacket", "doormat", "wall clock", "teapot"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_NOUNS = ["orders", "invoices", "readings", "scores", "parcels", "tickets", "samples", "payments", "visits", "trips"]
_ACCUMULATORS = ["total", "result", "count", "matches", "picked", "kept", "found", "tally"]
_NEW_NAMES = ["running_sum", "selected", "acc", "output", "bucket", "collected", "chosen", "summary"]
# (a sentence for the notes, a word of it, that word misspelt): the seeded typo of a "fix" task.
_TYPO_SENTENCES = [
    ("We should receive the signed copy next week.", "receive", "recieve"),
    ("Please keep the two budgets separate.", "separate", "seperate"),
    ("It is necessary to check the figures again before the audit.", "necessary", "neccessary"),
    ("The auditor arrives tomorrow morning.", "tomorrow", "tommorow"),
    ("We will definitely need more storage space.", "definitely", "definately"),
    ("The delivery schedule is still open.", "schedule", "schedual"),
]


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(2019, 2025)}"


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_NAMES)} {rng.choice(_SURNAMES)}"


def _misspell_one(text: str, name: str) -> str:
    """``text`` with the last use of identifier ``name`` misspelt (second and third letters swapped)."""
    at = text.rindex(name)
    return text[:at] + name[0] + name[2] + name[1] + name[3:] + text[at + len(name):]


# ------------------------------------------------------------------------------------------------ code


def _python(rng: random.Random) -> list[tuple[str, str, str]]:
    noun, acc, new = rng.choice(_NOUNS), rng.choice(_ACCUMULATORS), rng.choice(_NEW_NAMES)
    limit, cap = rng.randint(5, 500), rng.randint(2, 20)
    fn, helper = f"sum_large_{noun}", f"top_{noun}"
    code = (
        f"def {fn}({noun}, threshold={limit}):\n"
        f"    {acc} = 0\n"
        f"    for item in {noun}:\n"
        f"        if item.amount > threshold:\n"
        f"            {acc} += item.amount\n"
        f"    return {acc}\n\n\n"
        f"def {helper}({noun}, limit={cap}):\n"
        f"    ranked = sorted({noun}, key=lambda item: item.amount, reverse=True)\n"
        f"    names = [item.name for item in ranked[:limit]]\n"
        f"    return ', '.join(names)\n"
    )
    return [
        ("edit", code, f"Rename the variable `{acc}` to `{new}` in `{fn}` and show the whole file."),
        ("edit", code, f"Change the default threshold of `{fn}` from {limit} to {limit + cap} and show the file."),
        ("fix", _misspell_one(code, acc), "This code raises a NameError. Fix the misspelt name and return the file."),
        ("annotate", code, "Add a docstring to each function and a short comment above each loop; change no code."),
        ("continue", code, f"Repeat the file with type hints added to `{fn}` and `{helper}`."),
        ("answer", code, f"Quote the line of `{helper}` that sorts the {noun}."),
    ]


def _javascript(rng: random.Random) -> list[tuple[str, str, str]]:
    noun, acc, new = rng.choice(_NOUNS), rng.choice(_ACCUMULATORS), rng.choice(_NEW_NAMES)
    days, rate = rng.randint(2, 60), rng.choice([5, 8, 10, 12, 15, 20, 25])
    fn = f"overdue{noun.capitalize()}"
    code = (
        f"const MAX_AGE_DAYS = {days};\n"
        f"const FEE_PERCENT = {rate};\n\n"
        f"function {fn}({noun}, today) {{\n"
        f"  const {acc} = [];\n"
        f"  for (const entry of {noun}) {{\n"
        f"    const age = (today - entry.createdAt) / 86400000;\n"
        f"    if (age > MAX_AGE_DAYS && !entry.paid) {{\n"
        f"      {acc}.push({{ id: entry.id, fee: entry.amount * FEE_PERCENT / 100 }});\n"
        f"    }}\n"
        f"  }}\n"
        f"  return {acc};\n"
        f"}}\n\n"
        f"module.exports = {{ {fn} }};\n"
    )
    return [
        ("edit", code, f"Rename `{acc}` to `{new}` and show the whole module."),
        ("edit", code, f"Set FEE_PERCENT to {rate + 5} and MAX_AGE_DAYS to {days * 2}; show the whole module."),
        ("fix", _misspell_one(code, acc), "This module throws a ReferenceError. Fix the typo and show the module."),
        ("annotate", code, f"Add a JSDoc comment to `{fn}` and explain each constant in a comment; change no code."),
        ("reformat", code, "Rewrite the module with arrow functions and ES module exports, same behaviour."),
        ("answer", code, "Quote the line that decides whether an entry is overdue."),
    ]


def _sql(rng: random.Random) -> list[tuple[str, str, str]]:
    table, city, limit = rng.choice(_NOUNS), rng.choice(_CITIES), rng.randint(5, 100)
    year, amount = rng.randint(2019, 2025), rng.randint(10, 900)
    query = (
        f"WITH recent AS (\n"
        f"    SELECT customer_id, SUM(amount) AS spent, COUNT(*) AS n\n"
        f"    FROM {table}\n"
        f"    WHERE created_at >= '{year}-01-01' AND status = 'paid'\n"
        f"    GROUP BY customer_id\n"
        f")\n"
        f"select c.name, c.city, r.spent, r.n\n"
        f"from recent r join customers c on c.id = r.customer_id\n"
        f"where c.city = '{city}' and r.spent > {amount}\n"
        f"order by r.spent desc\n"
        f"limit {limit};\n"
    )
    return [
        ("edit", query, f"Change the city to '{rng.choice(_CITIES)}' and the limit to {limit + 10}; show the query."),
        ("edit", query, f"Rename the CTE `recent` to `{table}_since_{year}` everywhere and show the query."),
        ("fix", query.replace("GROUP BY", "GROPU BY"), "This query fails with a syntax error. Fix it and show it."),
        ("annotate", query, "Add a `--` comment above each clause explaining what it does; keep the SQL unchanged."),
        ("reformat", query, "Rewrite the query with every SQL keyword in upper case, one clause per line."),
        ("extract", query, "List every column name the query reads, each once."),
    ]


def _config(rng: random.Random) -> list[tuple[str, str, str]]:
    port, workers, city = rng.randint(1024, 9999), rng.randint(1, 32), rng.choice(_CITIES)
    config = {
        "service": f"{rng.choice(_NOUNS)}-api",
        "server": {"host": "0.0.0.0", "port": port, "workers": workers, "timeout_s": rng.choice([10, 30, 60, 120])},
        "database": {"url": f"postgres://db.{city.lower()}.internal:5432/app", "pool_size": rng.randint(2, 50),
                     "retries": rng.randint(1, 5)},
        "logging": {"level": rng.choice(["debug", "info", "warning"]), "file": f"/var/log/{city.lower()}/app.log"},
        "features": {"beta_dashboard": rng.random() < 0.5, "email_reports": rng.random() < 0.5,
                     "max_upload_mb": rng.choice([8, 16, 32, 64])},
        "owner": _person(rng),
    }
    text = json.dumps(config, separators=(",", ":"))  # minified, so that pretty-printing has work to do
    return [
        ("reformat", text, "Pretty-print this JSON config with two-space indentation, keys in their order."),
        ("reformat", text, "Convert this JSON config to YAML, keeping every key and value."),
        ("edit", text, f"Change the port to {port + 1} and the workers to {workers * 2}; return the JSON."),
        ("extract", text, "List every key path whose value is a boolean, with its value (e.g. a.b: true)."),
        ("answer", text, "Which file does the service log to? Quote the key and value exactly."),
    ]


# ------------------------------------------------------------------------------------------------ prose


_NOTE_SENTENCES = [
    "{a} moved to the {city} office on {date}.",
    "The budget review with {b} is planned for {date}.",
    "{a} asked {b} to send the draft contract before Friday.",
    "Our supplier in {city} raised prices by {n} percent this quarter.",
    "{b} will present the new {product} design at the next team meeting.",
    "The warehouse counted {n} damaged boxes after the storm.",
    "{a} thinks the launch should wait until the {product} passes its safety test.",
    "Customer complaints about the {product} fell for the third month in a row.",
    "The contract with the {city} client ends on {date}.",
    "{b} found that shipping from {city} takes {n} days on average.",
    "Everyone agreed that the old ticket system is slow and hard to search.",
    "The training for new staff starts on {date} and lasts {n} days.",
]


def _notes(rng: random.Random) -> list[tuple[str, str, str]]:
    a, b = rng.sample(_NAMES, 2)

    def fills() -> dict:  # fresh city, date, product and number for every sentence
        return {"a": a, "b": b, "city": rng.choice(_CITIES), "date": _date(rng), "product": rng.choice(_PRODUCTS),
                "n": rng.randint(2, 40)}

    # One sentence with a date and a name, so that the date and name tasks always have something to find.
    anchor = rng.choice([s for s in _NOTE_SENTENCES if "{date}" in s and ("{a}" in s or "{b}" in s)])
    forms = [anchor] + rng.sample([s for s in _NOTE_SENTENCES if s != anchor], rng.randint(5, 8))
    rng.shuffle(forms)
    sentences = [form.format(**fills()) for form in forms]
    typo_sentence, word, typo = rng.choice(_TYPO_SENTENCES)
    sentences.insert(rng.randint(1, len(sentences)), typo_sentence)
    text = " ".join(sentences)
    named = [n for n in (a, b) if n in text]  # the anchor names one of them
    new = rng.choice([n for n in _NAMES if n not in (a, b)])
    return [
        ("answer", text, f"Quote every sentence of these notes that mentions {named[0]}, exactly as written."),
        ("extract", text, "List every date in these notes, in the order they appear, with what happens on it."),
        ("edit", text, f"Rewrite the notes with {named[-1]} replaced by {new} everywhere; change nothing else."),
        ("fix", text.replace(word, typo), "Correct the spelling mistake in these notes and return the full text."),
        ("reformat", text, "Turn these notes into a bullet list, one sentence per bullet, in the same order."),
        ("continue", text, "Repeat these notes in the past tense, sentence by sentence."),
    ]


def _email(rng: random.Random) -> list[tuple[str, str, str]]:
    sender, recipient = _person(rng), _person(rng)
    meeting, deadline, city = _date(rng), _date(rng), rng.choice(_CITIES)
    product, count = rng.choice(_PRODUCTS), rng.randint(20, 400)
    text = (
        f"From: {sender}\nTo: {recipient}\nSubject: {product} order for {city}\n\n"
        f"Hi {recipient.split()[0]},\n\n"
        f"Thanks for the quick reply yesterday. We would like to order {count} units of the {product} for the "
        f"{city} store. Could you confirm the unit price and whether delivery before {deadline} is possible? "
        f"Our storage room is small, so we would prefer two separate deliveries.\n\n"
        f"I have also booked a call on {meeting} at {rng.randint(9, 16)}:00 to go through the contract. "
        f"Please bring the updated price list and the warranty terms.\n\n"
        f"Best regards,\n{sender}\n"
    )
    return [
        ("extract", text, "List every date, time, quantity and place in this email."),
        ("answer", text, "Quote the sentence in which the sender asks about delivery."),
        ("edit", text, f"Rewrite the email with the call moved to {_date(rng)}; change nothing else."),
        ("reformat", text, "Turn the email into a checklist of what the recipient has to do, quoting each request."),
        ("continue", text, f"Write {recipient.split()[0]}'s reply, quoting each question before answering it."),
    ]


# ------------------------------------------------------------------------------------------------ lists and tables


def _shopping_list(rng: random.Random) -> list[tuple[str, str, str]]:
    items = rng.sample(_PRODUCTS, rng.randint(8, 12))
    lines = []
    for item in items:
        price = f"EUR {rng.randint(3, 120)}.{rng.choice(['00', '50', '95'])}"
        lines.append(f"- {rng.randint(1, 9)} x {item} ({rng.choice(_CITIES)} shop, {price})")
    text = "\n".join(lines)
    price = rng.randint(20, 80)
    return [
        ("reformat", text, "Turn this list into a Markdown table with columns Quantity, Item, Shop and Price."),
        ("edit", text, "Sort this list alphabetically by item and show the whole list."),
        ("extract", text, f"List every line whose price is above EUR {price}, exactly as written."),
        ("continue", text, "Repeat the list with every quantity doubled, one line per item, same format."),
        ("answer", text, f"Which shop sells the {items[0]}? Quote its line."),
    ]


def _table(rng: random.Random) -> list[tuple[str, str, str]]:
    people = rng.sample([f"{n} {s}" for n in _NAMES for s in _SURNAMES], rng.randint(11, 16))  # no name twice
    rows = [(person, rng.choice(_CITIES), rng.randint(2010, 2025), rng.randint(100, 9999)) for person in people]
    header = ("name", "city", "joined", "amount")
    csv_form = rng.random() < 0.5
    if csv_form:
        text = "\n".join(",".join(map(str, row)) for row in [header, *rows])
        convert = "Convert this CSV to a Markdown table, keeping the row order."
    else:
        lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|"]
        text = "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])
        convert = "Convert this Markdown table to CSV with a header line, keeping the row order."
    city, year, (name, *_rest) = rows[0][1], rng.randint(2012, 2024), rng.choice(rows)
    return [
        ("reformat", text, convert),
        ("reformat", text, "Convert this table to a JSON list of objects, one per row, keys from the header."),
        ("extract", text, f"List every row whose city is {city}, exactly as written."),
        ("extract", text, f"Give the names of everyone who joined before {year}, in table order."),
        ("edit", text, f"Change {name}'s amount to {rng.randint(100, 9999)} and show the whole table."),
        ("continue", text, "Repeat the table sorted by amount, largest first, in the same format."),
    ]


# Each form makes one passage (and the variants its tasks need) from a seeded generator.
_FORMS: list[tuple[str, str, Callable[[random.Random], list[tuple[str, str, str]]]]] = [
    ("code", "Here is a Python module", _python),
    ("code", "Here is a JavaScript module", _javascript),
    ("code", "Here is a SQL query", _sql),
    ("code", "Here is a JSON config file", _config),
    ("prose", "Here are my meeting notes", _notes),
    ("prose", "Here is an email I received", _email),
    ("list", "Here is my shopping list", _shopping_list),
    ("table", "Here is a table", _table),
]


def grounded_items(seed: int = 0) -> list[GroundedPrompt]:
    """Every (passage, task) prompt for ``seed``, distinct, in a fixed shuffled order; the same seed gives the same
    list. Each prompt is an intro, the passage fenced by triple backticks, and the task."""
    rng = random.Random(seed)
    items, seen = [], set()
    for _ in range(PASSAGES_PER_FORM):
        for passage_kind, intro, make in _FORMS:
            for task_kind, passage, task in make(rng):
                passage = passage.strip("\n")
                text = f"{intro}:\n\n```\n{passage}\n```\n\n{task}"
                if text not in seen:  # a repeat would be sent at two levels
                    seen.add(text)
                    items.append(GroundedPrompt(passage_kind, task_kind, passage, text))
    rng.shuffle(items)
    return items


def grounded_prompts(seed: int = 0) -> list[str]:
    """The grounded set as prompt texts (``--dataset grounded``)."""
    return [item.text for item in grounded_items(seed)]


RECURRING_GROUP = 3  # passages whose tasks are mixed together: each level sees every task of a few passages


def grounded_recurring_prompts(seed: int = 0) -> list[str]:
    """The grounded set with passages that recur across requests (``--dataset grounded-recurring``): every task of
    a passage, the passages in a seeded order, the tasks of each :data:`RECURRING_GROUP` consecutive passages shuffled
    together. A level (a run of consecutive prompts) then asks several tasks of each passage it holds, as users
    working on the same document do; still distinct prompts, each sent once."""
    by_passage: dict[str, list[str]] = {}
    for item in grounded_items(seed):
        by_passage.setdefault(item.passage, []).append(item.text)
    groups = list(by_passage.values())
    rng = random.Random(seed + 1)
    rng.shuffle(groups)
    ordered: list[str] = []
    for start in range(0, len(groups), RECURRING_GROUP):
        chunk = [text for group in groups[start:start + RECURRING_GROUP] for text in group]
        rng.shuffle(chunk)
        ordered += chunk
    return ordered
