"""Training: features -> [dense statistics, out-of-fold Naive Bayes n-gram scores] -> logistic regression.

Two stages, both cheap to fit:

1. A multinomial Naive Bayes over the hashed n-gram / word buckets (closed form: weighted bucket
   shares per class). Its per-request score is the mean log-likelihood ratio of the request's
   buckets (code vs chat, math vs chat). The ratios are contrasted *within* each language
   (`nb_table`): a language only speaks to a pair of domains it has both of, with equal mass on both
   sides, so the script and the common words of a language carry no domain evidence, only the words
   that tell its domains apart do ("language is no evidence of domain").
2. scikit-learn's `LogisticRegression` over the standardised dense features plus those two NB
   scores. The NB scores the regression is trained on are out-of-fold: each row once as scored by an
   NB fitted without its source, and once (weight `lang_oof`) as scored by an NB fitted without its
   *language*, so the regression learns how far n-gram evidence carries to an unseen source and to an
   unseen language, and leans on the script-independent features (digits, operators, equations,
   code syntax, the multilingual marker lexicon) where the n-grams know nothing.

Balance (`sample_weights`): every domain gets the same total weight; inside a domain each language
gets mass ~ n ** lang_power and inside that each source ~ n ** source_power, so gsm8k (6k items)
does not drown the other math sources and English (mostly math) does not make "not English" mean
"chat". Multilingual templates (`classifier.synthetic_ml`) give every language every domain.
Held-out folds keep translation families together (`classifier.data.family`: an item held out takes
its translations in other languages and sources with it). Calibration: the artifact's one
temperature is fitted by log-loss on the pooled out-of-fold logits of leave-one-source-out and
leave-one-language-out; the figures reported for a fold use a temperature fitted on the other folds
only (`nested_temperatures`).

Everything exported is a plain array, scored in numpy by `classifier.model.Classifier`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize_scalar
from sklearn.linear_model import LogisticRegression

from classifier import features as F
from classifier.data import Example, family, script_of
from classifier.model import LABELS, Classifier

LABEL_INDEX = {label: i for i, label in enumerate(LABELS)}


@dataclass(frozen=True)
class TrainConfig:
    c: float = 0.1  # inverse L2 strength of the logistic regression
    nb_alpha: float = 0.1  # additive smoothing of the Naive Bayes counts (relative to a uniform bucket)
    nb_scale: float = 10.0  # NB scores are multiplied by this before the regression
    source_power: float = 0.5  # source mass inside a (language, domain) cell ~ n_source ** power
    lang_power: float = 0.5  # language mass inside a domain ~ n_(language, domain) ** power
    lang_oof: float = 0.8  # share of the regression's weight on NB scores fitted without the row's language
    max_iter: int = 2000
    # dense features the regression may not use (weight 0): statistics whose meaning changes with the
    # script (ASCII letter shares say "code" in a non-Latin language and "prose" in a Latin one)
    # (leave-one-script-out, grouped: macro-F1 0.70 with them, 0.89 without; bench/results/classifier-cv.json)
    drop_dense: tuple[str, ...] = ("share_upper", "share_lower", "share_non_ascii")


@dataclass
class Matrix:
    """Featurised examples."""

    dense: np.ndarray  # (n, N_DENSE)
    counts: sp.csr_matrix  # (n, N_BUCKETS) bucket counts
    totals: np.ndarray  # (n,) number of buckets (>= 1)
    junk: np.ndarray  # (n,)
    y: np.ndarray  # (n,) label index
    shares: sp.csr_matrix | None = None  # counts / totals: each request's buckets sum to 1

    def __post_init__(self) -> None:
        if self.shares is None:
            self.shares = sp.csr_matrix(sp.diags(1.0 / self.totals) @ self.counts)


def featurise(examples: Sequence[Example]) -> Matrix:
    n = len(examples)
    dense = np.zeros((n, F.N_DENSE), dtype=np.float64)
    junk = np.zeros(n, dtype=np.float64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    indices: list[np.ndarray] = []
    for i, ex in enumerate(examples):
        sample, full_len = F.request_text(ex.request)
        feats = F.extract(sample, full_len)
        dense[i] = feats.dense
        junk[i] = feats.junk
        indices.append(feats.buckets)
        indptr[i + 1] = indptr[i] + feats.buckets.size
    ind = np.concatenate(indices) if indices else np.zeros(0, dtype=np.intp)
    counts = sp.csr_matrix((np.ones(ind.size), ind, indptr), shape=(n, F.N_BUCKETS))
    counts.sum_duplicates()
    totals = np.maximum(np.diff(indptr), 1).astype(np.float64)
    y = np.array([LABEL_INDEX[ex.label] for ex in examples], dtype=np.int64)
    return Matrix(dense, counts, totals, junk, y)


def sample_weights(
    examples: Sequence[Example], idx: np.ndarray, source_power: float, lang_power: float = 1.0
) -> np.ndarray:
    """Domain-balanced, language- and source-dampened weights for the examples at `idx` (mean 1).

    Every domain gets the same total weight; inside a domain, each language gets mass proportional to
    n_(language, domain) ** lang_power, and inside that cell each source n_source ** source_power,
    shared equally by its items. So English (mostly math) does not make "not English" mean "chat",
    and gsm8k (6k items) does not drown the other math sources.
    """
    cells = [(examples[i].label, examples[i].lang, examples[i].source) for i in idx]
    n_src = Counter(cells)
    n_lang = Counter((d, lang) for d, lang, _ in cells)
    src_mass: Counter[tuple[str, str]] = Counter()
    for (d, lang, _), n in n_src.items():
        src_mass[(d, lang)] += n**source_power
    dom_mass: Counter[str] = Counter()
    for (d, _), n in n_lang.items():
        dom_mass[d] += n**lang_power
    n_domains = len(dom_mass)
    w = np.empty(len(idx), dtype=np.float64)
    for k, cell in enumerate(cells):
        d, lang, _ = cell
        lang_share = n_lang[(d, lang)] ** lang_power / dom_mass[d]
        src_share = n_src[cell] ** source_power / src_mass[(d, lang)]
        w[k] = lang_share * src_share / n_src[cell] / n_domains
    return w * (len(idx) / w.sum())


def _unit(ex: Example) -> str:
    """The unit the inner out-of-fold NB scores are computed by: source group, or extra source."""
    return ex.source if ex.group == "extra" else ex.group


def nb_table(
    cell_counts: np.ndarray,
    cell_mass: np.ndarray,
    alpha: float,
    minus: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """(N_BUCKETS, 2) log-likelihood ratios code/chat and math/chat, contrasted *within* languages.

    `cell_counts` (N_BUCKETS, 3 * n_langs) holds the weighted bucket shares of each (language, domain)
    cell (column 3 * language + domain), `cell_mass` (3 * n_langs,) the cells' total weight. For the
    pair (d, chat), a language takes part only if it has both domains; it brings the same mass
    (the smaller of its two cells) to both sides. A bucket that only one language uses (its script,
    its common words) then has as much weight on both sides unless it tells the domains apart inside
    that language: language alone is no evidence, and a language without math says nothing about math.

    `minus = (counts, mass, columns)`: leave those counts (of the given cell columns) out, without
    copying `cell_counts` (the out-of-fold tables of `fit`).
    """
    n_buckets = cell_counts.shape[0]
    n_langs = cell_mass.size // 3
    mass = cell_mass.astype(np.float64).copy()
    if minus is not None:
        mass -= minus[1]
        np.maximum(mass, 0.0, out=mass)
    mass = mass.reshape(n_langs, 3)
    out = np.zeros((n_buckets, 2))
    for d in (1, 2):
        both = np.minimum(mass[:, d], mass[:, 0])
        both[(mass[:, d] <= 1e-9) | (mass[:, 0] <= 1e-9)] = 0.0
        if both.sum() <= 0:
            continue
        a = alpha * both.sum() / n_buckets
        sides = []
        for k in (d, 0):
            wk = np.divide(both, mass[:, k], out=np.zeros(n_langs), where=both > 0)
            side = cell_counts[:, k::3] @ wk
            if minus is not None:
                sub, _, cols = minus
                wsub = np.zeros(cell_mass.size)
                wsub[k::3] = wk
                side -= np.asarray(sub @ wsub[cols]).ravel()
                np.maximum(side, 0.0, out=side)
            sides.append(np.log(side + a))
        out[:, d - 1] = sides[0] - sides[1]
    return out


def nb_scores(m: Matrix, rows: np.ndarray, table: np.ndarray) -> np.ndarray:
    return np.asarray(m.shares[rows] @ table)


def _cell_counts(m: Matrix, rows: np.ndarray, w: np.ndarray, cells: np.ndarray, n_cells: int):
    """(N_BUCKETS, n_cells) weighted bucket shares (sparse) and (n_cells,) weights of the rows' cells."""
    onehot = sp.csr_matrix((w, (np.arange(len(rows)), cells)), shape=(len(rows), n_cells))
    counts = sp.csc_matrix((onehot.T @ m.shares[rows]).T)
    return counts, np.bincount(cells, weights=w, minlength=n_cells)


def _nb_without(
    m: Matrix,
    idx: np.ndarray,
    w: np.ndarray,
    cells: np.ndarray,
    rows: np.ndarray,
    n_cells: int,
    total: np.ndarray,
    total_mass: np.ndarray,
    cfg: TrainConfig,
) -> np.ndarray:
    """NB scores of `idx[rows]` from a table fitted on every training row but `rows`."""
    cu, mass_u = _cell_counts(m, idx[rows], w[rows], cells[rows], n_cells)
    used = np.flatnonzero(mass_u > 0)
    table = nb_table(total, total_mass, cfg.nb_alpha, (cu[:, used], mass_u, used)) * cfg.nb_scale
    return nb_scores(m, idx[rows], table)


@dataclass
class Fitted:
    w_dense: np.ndarray  # (2, N_DENSE) on standardised features, relative to chat
    w_nb: np.ndarray  # (2, 2) on the NB scores
    nb: np.ndarray  # (N_BUCKETS, 2) NB log-likelihood ratios (already times nb_scale)
    bias: np.ndarray  # (2,)
    mu: np.ndarray
    sd: np.ndarray

    def logits(self, m: Matrix, idx: np.ndarray) -> np.ndarray:
        z = np.clip((m.dense[idx] - self.mu) / self.sd, -6.0, 6.0)
        out = z @ self.w_dense.T + nb_scores(m, idx, self.nb) @ self.w_nb.T + self.bias
        return np.hstack([np.zeros((len(idx), 1)), out])


def fit(examples: Sequence[Example], m: Matrix, idx: np.ndarray, cfg: TrainConfig) -> Fitted:
    """Fit on the examples at `idx` (nothing outside `idx` is looked at)."""
    idx = np.asarray(idx)
    missing = set(range(len(LABELS))) - set(np.unique(m.y[idx]).tolist())
    if missing:
        raise ValueError(f"training data has no {', '.join(LABELS[i] for i in sorted(missing))} examples")
    w = sample_weights(examples, idx, cfg.source_power, cfg.lang_power)
    langs = sorted({examples[i].lang for i in idx})
    lang_index = {lang: k for k, lang in enumerate(langs)}
    n_cells = 3 * len(langs)
    cells = np.array([3 * lang_index[examples[i].lang] for i in idx], dtype=np.int64) + m.y[idx]
    units = np.array([_unit(examples[i]) for i in idx])
    total, total_mass = _cell_counts(m, idx, w, cells, n_cells)
    total = total.toarray()
    nb_oof = np.zeros((len(idx), 2))
    for u in sorted(set(units.tolist())):
        rows = np.flatnonzero(units == u)
        nb_oof[rows] = _nb_without(m, idx, w, cells, rows, n_cells, total, total_mass, cfg)
    x_nb = [nb_oof]
    w_rows = [w * (1.0 - cfg.lang_oof)]
    if cfg.lang_oof > 0:  # the same rows, scored as if their language had never been seen
        row_lang = cells // 3
        nb_lang = np.zeros((len(idx), 2))
        for k in np.unique(row_lang):
            rows = np.flatnonzero(row_lang == k)
            nb_lang[rows] = _nb_without(m, idx, w, cells, rows, n_cells, total, total_mass, cfg)
        x_nb.append(nb_lang)
        w_rows.append(w * cfg.lang_oof)
    # the artifact stores the table as float32: use exactly those values here too
    nb_full = (nb_table(total, total_mass, cfg.nb_alpha) * cfg.nb_scale).astype(np.float32).astype(np.float64)

    dense = m.dense[idx]
    mu = dense.mean(axis=0)
    sd = dense.std(axis=0)
    sd[sd < 1e-6] = 1.0
    z = np.clip((dense - mu) / sd, -6.0, 6.0)
    if cfg.drop_dense:
        z[:, [F.DENSE_NAMES.index(n) for n in cfg.drop_dense]] = 0.0   # a zero column gets weight 0
    keep = [k for k, wk in enumerate(w_rows) if wk.sum() > 0]
    x = np.vstack([np.hstack([z, x_nb[k]]) for k in keep])
    clf = LogisticRegression(C=cfg.c, max_iter=cfg.max_iter)
    clf.fit(x, np.tile(m.y[idx], len(keep)), sample_weight=np.concatenate([w_rows[k] for k in keep]))
    coef = np.zeros((3, x.shape[1]))
    bias = np.zeros(3)
    coef[clf.classes_] = clf.coef_
    bias[clf.classes_] = clf.intercept_
    rel = coef[1:] - coef[0]
    return Fitted(
        w_dense=rel[:, : F.N_DENSE],
        w_nb=rel[:, F.N_DENSE :],
        nb=nb_full,
        bias=bias[1:] - bias[0],
        mu=mu,
        sd=sd,
    )


def softmax(logits: np.ndarray, temperature: float | np.ndarray = 1.0) -> np.ndarray:
    """Row-wise softmax of logits / temperature (a scalar, or one temperature per row)."""
    t = np.asarray(temperature, dtype=np.float64)
    z = logits / (t[:, None] if t.ndim == 1 else t)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def fit_temperature(logits: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The temperature minimising (weighted) log-loss of softmax(logits / T)."""
    w = np.ones(len(y)) if weights is None else weights

    def nll(log_t: float) -> float:
        p = softmax(logits, math.exp(log_t))
        return float(-(w * np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None))).sum() / w.sum())

    res = minimize_scalar(nll, bounds=(math.log(0.05), math.log(20.0)), method="bounded")
    return float(math.exp(res.x))


def apply_junk(probs: np.ndarray, junk: np.ndarray) -> np.ndarray:
    from classifier.model import junk_weight

    w = np.array([junk_weight(j) for j in junk])[:, None]
    return (1.0 - w) * probs + w / 3.0


def to_classifier(fitted: Fitted, temperature: float, meta: dict) -> Classifier:
    from classifier.model import ArtifactInfo, feature_config

    return Classifier(
        **vars(fitted),  # w_dense, w_nb, nb, bias, mu, sd: the fitted weights are the artifact's
        temperature=temperature,
        info=ArtifactInfo(
            version=str(meta.get("version", "")),
            data_hash=str(meta.get("data_hash", "")),
            feature_version=F.FEATURE_VERSION,
            trained_at=str(meta.get("trained_at", "")),
            metrics=dict(meta.get("metrics", {})),
        ),
        config=feature_config(),
    )


# ---------------------------------------------------------------------------------------------
# The training run: data, leave-one-source-out, random split, final model


@dataclass
class TrainingData:
    examples: list[Example]  # prompt items first, then extra text (evaluate=False)
    matrix: Matrix
    data_hash: str
    files: list[str]


def load_training_data(
    prompts_dir: str, corpus_dir: str | None, *, extra: bool = True, seed: int = 0
) -> TrainingData:
    from pathlib import Path

    from classifier.data import code_references, corpus_chat, hash_files, read_prompt_dir, stdlib_code
    from classifier.synthetic import synthetic_examples
    from classifier.synthetic_ml import multilingual_examples

    prompts, files = read_prompt_dir(prompts_dir)
    examples = list(prompts)
    if extra:
        if corpus_dir is not None and Path(corpus_dir).is_dir():
            chat, used = corpus_chat(
                Path(corpus_dir), {"dolly_open_qa.jsonl": 800, "sgd_dialogues.jsonl": 300}, seed=seed
            )
            examples += chat
            files = files + used
        examples += stdlib_code(500, seed=seed)
        examples += code_references(Path(prompts_dir))
        examples += synthetic_examples(300, seed=seed)
        examples += multilingual_examples(60, seed=seed)
    return TrainingData(examples, featurise(examples), hash_files(files), [str(f) for f in files])


def leave_one_source_out(
    data: TrainingData, cfg: TrainConfig, log=print, grouped: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Out-of-fold logits of every evaluated example, each from a model that never saw its source.

    Returns (idx, logits, fold). Extra text derived from a source (its references) is held out with
    it; `grouped`: so is every translation of a held-out item in another source (`classifier.data.family`).
    """
    sources = sorted({e.source for e in data.examples if e.evaluate})
    groups = np.array([e.group for e in data.examples])
    line = "  leave-one-source-out {held:<20} n={n:<5} accuracy={acc:.3f}"
    return _held_out_logits(data, cfg, groups, sources, line, log, grouped)


def leave_one_language_out(
    data: TrainingData, cfg: TrainConfig, log=print, grouped: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Out-of-fold logits of every evaluated example, each from a model that never saw its language.

    For each language of the evaluated prompts (English included), every example of that language
    is held out: its prompts, and the extra training text written in it (the multilingual templates;
    for English also the corpus dialogues, the standard-library code and the English templates);
    `grouped`: and every translation of a held-out item into another language. What the model still
    knows of the language is the marker lexicon only. Returns (idx, logits, fold).
    """
    langs = np.array([e.lang for e in data.examples])
    evaluated = sorted({e.lang for e in data.examples if e.evaluate})
    line = "  leave-one-language-out {held:<4} n={n:<6} accuracy={acc:.3f}"
    return _held_out_logits(data, cfg, langs, evaluated, line, log, grouped)


def leave_one_script_out(
    data: TrainingData, cfg: TrainConfig, log=print, grouped: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Out-of-fold logits of every evaluated example, each from a model that never saw its script:
    every example of every language written in it (`classifier.data.script_of`) is held out, and
    (`grouped`) every translation of a held-out item. Returns (idx, logits, fold)."""
    scripts = np.array([script_of(e.lang) for e in data.examples])
    evaluated = sorted({script_of(e.lang) for e in data.examples if e.evaluate})
    line = "  leave-one-script-out {held:<9} n={n:<6} accuracy={acc:.3f}"
    return _held_out_logits(data, cfg, scripts, evaluated, line, log, grouped)


def _held_out_logits(
    data: TrainingData,
    cfg: TrainConfig,
    keys: np.ndarray,
    held: list[str],
    line: str,
    log: Callable[[str], object],
    grouped: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each value in `held` (in order), fit on the examples whose key differs (`grouped`: and
    whose translation family has no member among the held-out ones) and score the evaluated ones whose
    key equals it; `line` is the log format ({held}, {n}, {acc}). Returns (idx, logits, fold) of every
    evaluated example, `fold` the index in `held` of the fold that scored it."""
    ex = data.examples
    evaluate = np.array([e.evaluate for e in ex])
    fams = np.array([family(e) for e in ex])
    logits = np.zeros((len(ex), 3))
    fold = np.full(len(ex), -1, dtype=np.int64)
    for k, value in enumerate(held):
        out = keys == value
        if grouped:
            out |= np.isin(fams, np.unique(fams[out]))
        train_idx = np.flatnonzero(~out)
        test_idx = np.flatnonzero((keys == value) & evaluate)
        fitted = fit(ex, data.matrix, train_idx, cfg)
        logits[test_idx] = fitted.logits(data.matrix, test_idx)
        fold[test_idx] = k
        acc = float((logits[test_idx].argmax(1) == data.matrix.y[test_idx]).mean())
        log(line.format(held=value, n=len(test_idx), acc=acc))
    idx = np.flatnonzero(evaluate)
    return idx, logits[idx], fold[idx]


def nested_temperatures(logits: np.ndarray, y: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Per row, the temperature fitted on the out-of-fold logits of every *other* fold: no row is
    scored with a calibration its own label took part in (nested calibration)."""
    temps = np.ones(len(y))
    for k in np.unique(fold):
        mask = fold == k
        temps[mask] = fit_temperature(logits[~mask], y[~mask]) if (~mask).any() else 1.0
    return temps


def random_split(
    data: TrainingData, cfg: TrainConfig, test_share: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A stratified (source x domain) random split; extra text always stays in training."""
    ex = data.examples
    rng = np.random.default_rng(seed)
    strata: dict[tuple[str, str], list[int]] = {}
    for i, e in enumerate(ex):
        if e.evaluate:
            strata.setdefault((e.source, e.label), []).append(i)
    test: list[int] = []
    for key in sorted(strata):
        members = np.array(strata[key])
        rng.shuffle(members)
        test += members[: int(round(len(members) * test_share))].tolist()
    test_idx = np.array(sorted(test))
    train_idx = np.setdiff1d(np.arange(len(ex)), test_idx)
    fitted = fit(ex, data.matrix, train_idx, cfg)
    return test_idx, fitted.logits(data.matrix, test_idx)


def save_artifact(path: str, fitted: Fitted, temperature: float, meta: dict) -> None:
    """Write the artifact: plain float32/float64 arrays + JSON metadata (no pickled objects)."""
    import json
    import os
    from pathlib import Path

    from classifier.model import feature_config

    meta = {**meta, "features": feature_config(), "labels": list(LABELS)}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(
        tmp,
        w_dense=fitted.w_dense.astype(np.float64),
        w_nb=fitted.w_nb.astype(np.float64),
        nb=fitted.nb.astype(np.float32),
        bias=fitted.bias.astype(np.float64),
        mu=fitted.mu.astype(np.float64),
        sd=fitted.sd.astype(np.float64),
        temperature=np.array(temperature, dtype=np.float64),
        meta_json=np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8),
    )
    os.replace(tmp, out)
