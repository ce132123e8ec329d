"""Template-generated training text (deterministic), used only for training, never evaluated.

The shared prompt sources are stylistically narrow (gsm8k is only word problems, MATH only
LaTeX competition problems, humaneval/mbpp only function requests), so a model trained on all
but one of them has seen little of the held-out style. These small template sets put the generic
knowledge in: LaTeX and arithmetic are math, questions about programming tools are code, writing
tasks with numeric constraints are chat. They are written from general knowledge of each domain,
not copied from any prompt file.
"""

from __future__ import annotations

import random

from classifier.data import Example

_NAMES = ["Ava", "Liam", "Maya", "Noah", "Priya", "Omar", "Lena", "Kenji", "Sara", "Diego", "Zoe", "Ibrahim"]
_ITEMS = [
    "apples",
    "stickers",
    "marbles",
    "books",
    "cookies",
    "pencils",
    "cards",
    "stamps",
    "shells",
    "toy cars",
]
_LANGS = [
    "Python",
    "JavaScript",
    "TypeScript",
    "Java",
    "C++",
    "C#",
    "Go",
    "Rust",
    "Ruby",
    "PHP",
    "Kotlin",
    "Swift",
    "Bash",
    "SQL",
    "R",
    "Scala",
    "Haskell",
    "Lua",
    "MATLAB",
    "VBA",
]
_TECH = [
    "React",
    "Vue",
    "Angular",
    "Django",
    "Flask",
    "FastAPI",
    "Spring Boot",
    "Laravel",
    "Node.js",
    "Express",
    "PostgreSQL",
    "MySQL",
    "MongoDB",
    "Redis",
    "Docker",
    "Kubernetes",
    "Terraform",
    "AWS Lambda",
    "nginx",
    "pandas",
    "NumPy",
    "PyTorch",
    "TensorFlow",
    "scikit-learn",
    "Git",
    "GitHub Actions",
    "Tailwind CSS",
    "Next.js",
    "Svelte",
    "Unity",
    "Excel VBA",
    "PowerShell",
    "the Linux command line",
    "Jupyter",
    "Kafka",
    "Spark",
    "Elasticsearch",
    "GraphQL",
    "gRPC",
    "WebSockets",
    "OpenCV",
    "Selenium",
    "Streamlit",
]
_CODE_TASKS = [
    "read a CSV file and remove duplicate rows",
    "parse JSON from an HTTP response",
    "connect to a database",
    "sort a list of dictionaries by a key",
    "debounce a function",
    "write unit tests for a class",
    "handle exceptions in async code",
    "upload a file to S3",
    "set up authentication with JWT",
    "paginate query results",
    "merge two branches without losing commits",
    "profile slow code",
    "reverse a linked list",
    "implement a binary search tree",
    "cache expensive function calls",
    "schedule a background job",
    "stream a large file",
    "validate form input",
    "build a REST API endpoint",
    "deploy the app to a container",
    "fix a memory leak",
    "read environment variables",
    "rename files in bulk",
    "draw a bar chart from a dataframe",
    "train a small neural network",
    "scrape a web page",
    "create a dropdown menu component",
    "add a dark mode toggle",
    "write a regex that matches email addresses",
    "convert a string to a date",
    "multithread a download loop",
    "find the most frequent element in an array",
]
_CHAT_TOPICS = [
    "climate change",
    "the Roman Empire",
    "remote work",
    "healthy sleep",
    "learning a new language",
    "city gardening",
    "the history of jazz",
    "space exploration",
    "friendship",
    "minimalism",
    "public libraries",
    "renewable energy",
    "job interviews",
    "a rainy day",
    "social media",
    "travelling in Japan",
    "the ocean",
    "kindness",
    "a small bakery",
    "electric cars",
]
_GENRES = [
    "poem",
    "short story",
    "essay",
    "blog post",
    "song",
    "limerick",
    "haiku",
    "speech",
    "letter",
    "product description",
    "cover letter",
    "tweet",
    "movie review",
    "newsletter",
    "riddle",
    "dialogue",
]


def _math(rng: random.Random) -> str:
    a, b, c, d = (rng.randint(2, 99) for _ in range(4))
    n = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    ang = rng.choice([15, 30, 45, 60, 120, 135, 150, 210, 225, 300])
    templates = [
        f"Compute ${a} \\times {b} + {c}$.",
        f"Find $x$ if ${a}x + {b} = {c}$.",
        f"Solve for $x$: $x^2 - {a + b}x + {a * b} = 0$.",
        f"Evaluate $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$ and express the answer as a common fraction.",
        f"What is $\\sqrt{{{a * a}}} + \\sqrt{{{b * b}}}$?",
        f"Simplify $({a}x + {b})({c}x - {d})$.",
        f"Compute $\\sin {ang}^\\circ$.",
        f"How many positive divisors does {a * b} have?",
        f"What is the remainder when {a * b * c} is divided by {d}?",
        f"Let $f(x) = {a}x^2 - {b}x + {c}$. What is $f({d % 10})$?",
        f"In right triangle $ABC$ with $\\angle B = 90^\\circ$, $AB = {a}$ and $BC = {b}$. Find $AC$.",
        f"Two fair dice are rolled. What is the probability that the sum is {rng.randint(2, 12)}?",
        f"What is {a}% of {b * 10}?",
        f"The sum of two numbers is {a + b} and their difference is {abs(a - b)}. What is the larger number?",
        f"If $\\log_{{2}} x = {a % 12}$, what is $x$?",
        f"Find the greatest common divisor of {a * c} and {b * c}.",
        f"How many ways can {a % 8 + 3} people be seated in a row of {a % 8 + 3} chairs?",
        f"The first term of an arithmetic sequence is {a} and the common difference is {b}. What is the {c}th term?",
        f"{n} has {a} {item}. {n} buys {b} more and gives {c % a} to a friend. How many {item} does {n} have now?",
        f"A train travels at {a} km per hour for {b % 9 + 1} hours. How far does it travel?",
        f"{n} earns ${a} per hour and works {b % 40 + 5} hours a week. How much does {n} earn in {c % 8 + 2} weeks?",
        f"A shop sells {item} for ${a} each. If {n} buys {b % 12 + 2} and pays with ${a * 20}, how much change is left?",
        f"There are {a} students in a class and {b % a if a else 1} of them are girls. What fraction of the class are boys?",
        f"A rectangle has a length of {a} cm and a width of {b} cm. What is its area and its perimeter?",
        f"{n} reads {a} pages on Monday and twice as many on Tuesday. How many pages did {n} read in total?",
        f"The price of a jacket is ${a * 5}. It is discounted by {b % 50 + 5}%. What is the new price?",
        f"What is the value of ${a}^{{{b % 5 + 2}}} - {c}$?",
        f"If $x + y = {a}$ and $xy = {b}$, what is $x^2 + y^2$?",
        f"A bag has {a} red and {b} blue marbles. One marble is drawn at random. What is the probability it is red?",
        f"Find all real $x$ such that $|x - {a}| < {b}$.",
    ]
    return rng.choice(templates)


_CODE_TEMPLATES = """\
How do I {task} in {lang}?
What is the best way to {task} with {tech}?
Can you show me how to {task} using {tech}? I'm new to {lang}.
I'm getting an error when I try to {task} in {lang}. How can I fix it?
Write a {lang} script to {task}.
Explain how to {task} in {lang}, with a short example.
My {tech} app crashes when I {task}. What could be wrong?
What's the difference between a list and a tuple in {lang}?
How can I set up {tech} on Ubuntu for a new project?
Please review my approach: I want to {task} in {tech}. Is there a cleaner way?
Using {tech}, I want to {task}. Where should I start?
Is it possible to {task} in {lang} without an external library?
Convert this logic to {lang}: {task}.
I have a {tech} project and need to {task}. Can you give me the code?
""".splitlines()


def _code(rng: random.Random) -> str:
    lang = rng.choice(_LANGS)
    tech = rng.choice(_TECH)
    task = rng.choice(_CODE_TASKS)
    return rng.choice(_CODE_TEMPLATES).format(lang=lang, tech=tech, task=task)


_CHAT_TEMPLATES = """\
Write a {genre} about {topic} in less than {words} words.
Give me {k} tips for {topic}.
List {k} interesting facts about {topic}. Use bullet points.
Write a {genre} about {topic}. The word 'light' should appear at least {k} times.
What happened in {year} that changed {topic}?
Summarize the main arguments for and against {topic} in {k} sentences.
Write a {genre} about {topic} with exactly {k} paragraphs, separated by ***.
I have {k} days off next month. What should I do to relax?
My friend and I disagree about {topic}. Can you explain both sides?
Write a {words}-word {genre} for kids about {topic}. Do not use any commas.
Rewrite this sentence in a more formal tone: 'we gotta talk about {topic} asap'.
What are {k} good books about {topic}?
Answer in {k} sentences: why do people care about {topic}?
Pretend you are a tour guide in {year}. Describe your day in {k} short paragraphs.
""".splitlines()


def _chat(rng: random.Random) -> str:
    topic = rng.choice(_CHAT_TOPICS)
    genre = rng.choice(_GENRES)
    k = rng.randint(2, 12)
    words = rng.choice([50, 100, 150, 200, 300, 500])
    year = rng.randint(1800, 2020)
    return rng.choice(_CHAT_TEMPLATES).format(topic=topic, genre=genre, k=k, words=words, year=year)


def synthetic_examples(n_per_domain: int = 300, seed: int = 0) -> list[Example]:
    """`n_per_domain` template prompts for each of chat, code and math (duplicates removed)."""
    out: list[Example] = []
    for label, gen in (("chat", _chat), ("code", _code), ("math", _math)):
        rng = random.Random(f"classifier-synthetic:{label}:{seed}")
        seen: set[str] = set()
        tries = 0
        while len(seen) < n_per_domain and tries < 20 * n_per_domain:
            seen.add(gen(rng))
            tries += 1
        out += [
            Example(text, label, f"extra:synthetic_{label}", "extra", f"extra:synthetic_{label}/{i}", False)
            for i, text in enumerate(sorted(seen))
        ]
    return out
