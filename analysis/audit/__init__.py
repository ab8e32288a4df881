"""The empirical privacy audit of a run's models (docs/algorithms.md §4, "The privacy audit").

Two questions, two tools:

- **Membership inference** (:mod:`.membership`, scores from :mod:`.scores`): for each
  client and each model a run kept, can an attacker who holds a patch tell whether it was
  one of the client's training patches? Members are the client's training patches,
  non-members its own held-out (test) patches: the same centre and distribution. The
  attacks are the loss attack and LiRA offline (Carlini et al. 2022), calibrated by
  reference models trained on random halves of the same patches (:mod:`.references`).
  Reported: AUC and TPR at 1 % and 0.1 % FPR, with bootstrap intervals.
- **An ε lower bound from one training run** (Steinke, Nasr and Jagielski, NeurIPS 2023;
  :mod:`.one_run`): m canaries per client, each in its training data with probability ½
  (:mod:`.canaries`, a seeded coin, recorded), one run, the attack's guesses on the
  canaries, and a bound that every (ε, δ)-DP training must respect with 95 % confidence.

:mod:`.runs` reads a run directory and returns its audit rows.
"""
