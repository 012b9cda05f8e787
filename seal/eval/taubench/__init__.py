"""τ²-bench through the real τ² package (docs/evaluation.md): ``seal-eval tau2 ...``.

* `seal.eval.taubench.harness`: this side — the paper's protocol and the comparability check, serving a
  checkpoint, running each domain, scoring pass^1, the evaluation directory and the ``seal-eval tau2`` options.
* `seal.eval.taubench.driver`: τ²'s side — a script run under τ²'s own interpreter (``.venv-tau2``) that calls τ²'s
  CLI and scores with τ²'s metrics. Run as a script, its folder leads that interpreter's ``sys.path``: no module
  here may be named like the τ² package (``tau2``) or anything τ² imports, hence these names.
"""
