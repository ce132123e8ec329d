"""D-Cut: adaptive verification depth under a global budget (AngelSlim D-Cut, specdec-anchors §8).

Each step the drafter proposes k tokens per running request with a confidence c (the draft
probability of the chosen token). The marginal value of verifying draft position j of row i is
P(L_i >= j), estimated by the prefix product s[i, j] = f_j * prod_{t<=j} c[i, t] (f_j: a per-position
calibration factor learned from observed acceptance; scores are made non-increasing along j). A
global top-K over all (i, j) therefore keeps a prefix of every row. For each keep ratio rho in
RATIOS the expected step throughput is

    U(rho) = (bs + sum of the top-K(rho) scores) / (C(bs, rho) + overhead)

(every row emits at least one token per step: the correction or bonus), where C is the measured
verify cost table. The ratio with the highest U wins (one that prunes must beat rho = 1.0 by
10% / sqrt(bs): the steps whose scores look worst are where they most underestimate); rho = 1.0
(verify everything) is always a candidate and the table is monotone in rho, so a chosen step is
never predicted to cost more than verifying everything.

Modules:

- `cost`: the cost table (`CostTable`), pure;
- `selection`: scores, the global top-K and its grouping into verify forwards, calibration, whether
  drafting pays; pure functions of numpy arrays, no I/O;
- `profile`: measuring the cost table and caching it per machine (the I/O edge);
- `controller`: `DcutController`, the small stateful wrapper the batcher owns (calibration state,
  live on/off switch, recent kept ratio, plain steps where drafting does not pay).
"""
