"""Rubric judging: weighted criteria graded in one call (``criteria``: the criteria and the reply's
labelled verdicts), the scoring path (``scoring``) and each criterion's expected verdict
(``weighting``)."""
