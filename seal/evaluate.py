"""`python -m seal.evaluate`: the evaluation command (implementation in `seal.eval.evaluate`)."""

from seal.eval.evaluate import main

if __name__ == "__main__":
    raise SystemExit(main())
