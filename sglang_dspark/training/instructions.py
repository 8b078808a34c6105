"""Everyday instruction prompts for draft training: code, arithmetic, writing, how-to, comparisons, classification.

BIG-bench inputs are puzzles and test items; users of a chat server also ask for code, sums, e-mails, recipes and
advice. These prompts are composed here from hand-written templates and fillers (no data set, nothing to license),
so the draft sees the target answer those kinds of requests too.

They are kept apart from the load test's built-in chat set (``sglang_dspark.loadtest.prompts``), which is a
held-out evaluation set of the draft: no template here is one of its task forms (explain / poem / misconceptions /
history / pros and cons / story ...) and no filler is one of its subjects; ``tests/unit/training/test_instructions.py``
checks both.
"""

from __future__ import annotations

import random
from typing import Callable, List

from .corpus import Prompt

TASK_NAME = "instructions"

_CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the largest of three numbers",
    "counts the vowels in a word", "removes duplicates from a list while keeping the order",
    "converts Celsius to Fahrenheit", "returns the factorial of n", "checks whether a word is a palindrome",
    "merges two sorted lists", "returns the n-th Fibonacci number", "flattens a nested list",
    "counts how often each word appears in a sentence", "returns the second smallest number in a list",
    "checks whether two strings are anagrams", "computes the average of a list of numbers",
    "capitalises the first letter of every word", "finds the longest word in a sentence",
    "returns the sum of the digits of an integer", "rotates a list by k positions",
    "checks whether a year is a leap year", "converts a binary string to an integer",
    "returns the greatest common divisor of two numbers", "splits a list into chunks of size n",
    "reads a text file and returns its number of lines", "validates a simple e-mail address",
    "transposes a matrix given as a list of lists", "returns all even numbers from a list",
    "counts the uppercase letters in a string", "returns the index of an item in a sorted list",
    "formats a number of seconds as hours, minutes and seconds",
]
_CODE_FORMS = [
    "Write a Python function that {t}.",
    "Write a JavaScript function that {t}.",
    "Show me a short Python snippet that {t}, with a usage example.",
    "I need a function that {t}. Please write it in Python and add a docstring.",
    "Write a C function that {t}.",
]
_CODE_QUESTIONS = [
    "What does `print(len('hello world'))` print in Python?",
    "What is the difference between a list and a tuple in Python?",
    "Why does `0.1 + 0.2 == 0.3` return False in Python?",
    "What does the `git rebase` command do?",
    "How do I install a Python package with pip?",
    "What is the difference between `==` and `is` in Python?",
    "What does a SQL `LEFT JOIN` return?",
    "How do I read a CSV file with pandas?",
    "What does `SELECT COUNT(*) FROM users;` do?",
    "How do I undo the last git commit but keep my changes?",
    "What is a Python decorator? Give a small example.",
    "How do I loop over a dictionary's keys and values in Python?",
    "What does the `chmod 755` command do on Linux?",
    "What is the difference between `let` and `const` in JavaScript?",
    "How do I reverse a list in Python?",
    "What does HTTP status code 404 mean?",
]

_ITEMS = ["apples", "notebooks", "pencils", "tickets", "coffee cups", "bus passes", "lamps", "towels", "plants",
          "pairs of socks"]


def _maths(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 90), rng.randint(2, 12)
    forms = [
        lambda: f"A shop sells {rng.choice(_ITEMS)} for ${a} each. How much do {c} of them cost?",
        lambda: f"Solve for x: {c}x + {a} = {a + c * b}.",
        lambda: f"What is {rng.choice([5, 10, 15, 20, 25, 30, 40, 75])}% of {b * 10}?",
        lambda: f"A train travels {a * 10} km in {c} hours. What is its average speed?",
        lambda: f"I have {b} marbles and give away {a % b}. Then I buy {c} more. How many do I have now?",
        lambda: f"What is {a} times {b}? Show your working.",
        lambda: f"A rectangle is {a} cm long and {c} cm wide. What are its area and perimeter?",
        lambda: f"If a recipe for {c} people needs {a * 10} grams of flour, how much flour do {c * 2} people need?",
        lambda: f"Round {a * 1000 + b * 7}.{b} to the nearest hundred.",
        lambda: f"What is the average of {a}, {b} and {c}?",
    ]
    return rng.choice(forms)()


_RECIPIENTS = ["my landlord", "a colleague", "my manager", "a customer", "my neighbour", "a hotel", "a professor",
               "the school", "a supplier", "my team"]
_MATTERS = ["a broken heating system", "moving a meeting to next week", "a late delivery", "asking for a day off",
            "a refund for a cancelled order", "thanking them for their help", "a noise complaint",
            "a change of address", "a missed deadline", "booking a room for two nights"]
_SENTENCES = ["hey, can u send me the file asap?", "The meeting was kinda boring and too long.",
              "We messed up the order, sorry about that.", "I ain't coming tomorrow cuz I'm sick.",
              "This product is super cool and you should totally buy it.", "Pls fix the bug, it's driving me nuts.",
              "The results are not bad at all.", "Gonna be late, traffic is crazy.",
              "Our sales went up a lot this year.", "I think maybe we could possibly try a different approach."]
_NAMED_THINGS = ["a bakery", "a cat", "a podcast about gardening", "a hiking club", "a mobile app for budgeting",
                 "a coffee shop", "a board game", "a fantasy kingdom", "a robot vacuum", "a running team"]


def _writing(rng: random.Random) -> str:
    forms = [
        lambda: f"Write a polite email to {rng.choice(_RECIPIENTS)} about {rng.choice(_MATTERS)}.",
        lambda: f"Rewrite this sentence in a formal tone: \"{rng.choice(_SENTENCES)}\"",
        lambda: f"Give me {rng.randint(3, 8)} name ideas for {rng.choice(_NAMED_THINGS)}.",
        lambda: f"Correct the grammar in this sentence: \"{rng.choice(_SENTENCES)}\"",
        lambda: f"Write a two-sentence text message to {rng.choice(_RECIPIENTS)} about {rng.choice(_MATTERS)}.",
        lambda: f"Write a short slogan for {rng.choice(_NAMED_THINGS)}.",
    ]
    return rng.choice(forms)()


_HOW_TO = ["clean a cast iron pan", "prepare for a job interview", "change a flat bicycle tyre",
           "start running as a beginner", "keep houseplants alive", "make a budget for the month",
           "get better at public speaking", "remove a coffee stain from a shirt", "fall asleep faster",
           "pack a suitcase efficiently", "learn a new language on my own", "organise a small kitchen",
           "write a good cover letter", "stay focused while working from home", "care for a new puppy",
           "save money on groceries", "set up a home Wi-Fi network", "make friends in a new city",
           "back up the photos on my phone", "train for a 5 km run"]
_DISHES = ["tomato soup", "pancakes", "a vegetable stir-fry", "guacamole", "banana bread", "a lentil curry",
           "scrambled eggs", "a Greek salad", "pasta with garlic and oil", "overnight oats", "hummus",
           "fried rice"]
_PAIRS = [("weather", "climate"), ("a virus", "a bacterium"), ("a crocodile", "an alligator"),
          ("baking soda", "baking powder"), ("a lake", "a pond"), ("RAM", "storage"), ("a debit card", "a credit card"),
          ("a simile", "a metaphor"), ("speed", "velocity"), ("a tornado", "a cyclone"), ("jam", "jelly"),
          ("a star", "a planet"), ("a comet", "an asteroid"), ("empathy", "sympathy"), ("a loan", "a grant"),
          ("a frog", "a toad"), ("a fruit", "a vegetable"), ("latitude", "longitude")]
_REVIEWS = ["The battery died after two days and support never answered.", "Absolutely loved it, would buy again!",
            "It works, but the instructions were confusing.", "Fast delivery and great quality for the price.",
            "The food was cold and the waiter was rude.", "Best concert I have been to in years.",
            "Not worth the money.", "The room was clean and the staff were friendly.",
            "It broke the first time I used it.", "A decent phone with an excellent camera."]


def _everyday(rng: random.Random) -> str:
    forms = [
        lambda: f"How do I {rng.choice(_HOW_TO)}?",
        lambda: f"Give me a simple recipe for {rng.choice(_DISHES)}.",
        lambda: "What is the difference between {} and {}?".format(*rng.choice(_PAIRS)),
        lambda: f"Is this review positive, negative or mixed? \"{rng.choice(_REVIEWS)}\"",
        lambda: f"What are some tips to {rng.choice(_HOW_TO)}?",
        lambda: f"What ingredients do I need for {rng.choice(_DISHES)}?",
        lambda: f"Answer in one sentence: how do I {rng.choice(_HOW_TO)}?",
    ]
    return rng.choice(forms)()


def _code(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(_CODE_QUESTIONS)
    return rng.choice(_CODE_FORMS).format(t=rng.choice(_CODE_TASKS))


_KINDS: List[Callable[[random.Random], str]] = [_code, _maths, _writing, _everyday]


def instruction_prompts(count: int, seed: int = 0) -> List[Prompt]:
    """``count`` distinct prompts, the four kinds in turn, deterministic in ``seed``. Code, writing and everyday
    templates give a few hundred prompts each, arithmetic many more; asking for more than all of them give raises
    instead of repeating."""
    rng = random.Random(seed)
    prompts: List[Prompt] = []
    seen = set()
    attempt = misses_in_a_row = 0
    while len(prompts) < count:
        # kinds by attempt, not by prompt: a kind whose templates are used up leaves its turns to the others
        text = _KINDS[attempt % len(_KINDS)](rng)
        attempt += 1
        if text in seen:
            misses_in_a_row += 1
            if misses_in_a_row > 20_000:  # every kind is (all but) used up
                raise ValueError(f"only {len(prompts)} distinct instruction prompts found; ask for fewer")
            continue
        misses_in_a_row = 0
        seen.add(text)
        prompts.append(Prompt(task=TASK_NAME, index=len(prompts), text=text))
    return prompts
