"""Campaign contributions: estimate first, then classify and extract.

Reads ``../shared/data/contributions.csv`` (US campaign-finance filings, 15
columns; or the first 200 rows shipped in ``examples/data/``), takes a slice
of filings with an employer and an occupation, and:

- prices the call before sending anything (``df.llm.estimate``): requests,
  input tokens, how many of them the engine's prefix cache should serve in
  semframe's order and in the file's order;
- ``classify``: the contributor's economic sector, one of six labels;
- ``extract``: a typed record per filing (is the contributor retired, a
  one-word job category);
- prints the sector counts and what the run actually cost next to the estimate.

    python examples/contributions.py                 # 24 filings, local engine
    python examples/contributions.py --rows 60
    python examples/contributions.py --backend fake  # no model: instant smoke test

The default local model (SmolLM2-135M) is tiny: every answer is one of the
labels or a valid record, but its judgement is weak. Point ``model=`` at a
larger GGUF file for useful answers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import semframe

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data" / "contributions.csv"
SLICE = HERE / "data" / "contributions_slice.csv"
FIELDS = ["NAME", "CITY", "STATE", "EMPLOYER", "OCCUPATION", "TRANSACTION_AMT"]
SECTORS = ["finance", "health", "technology", "education", "retired or not employed", "other"]


def load(rows: int) -> pd.DataFrame:
    source = SHARED if SHARED.exists() else SLICE
    df = pd.read_csv(source, dtype=str, keep_default_na=False)
    df = df[(df["EMPLOYER"].str.strip() != "") & (df["OCCUPATION"].str.strip() != "")]
    df = df[FIELDS].head(rows).copy()
    df["NAME"] = df["NAME"].str.strip()
    return df


def main() -> None:
    parser = argparse.ArgumentParser(description="semframe on campaign contributions")
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--backend", default=None, help="default: from configuration (local)")
    args = parser.parse_args()
    # cache=False so that a re-run is measured again rather than served from the
    # result cache (the comparison with the estimate below would be meaningless).
    opts = {"backend": args.backend, "errors": "keep", "cache": False}

    filings = load(args.rows)
    print(
        f"{len(filings)} filings, {filings['EMPLOYER'].nunique()} employers, "
        f"{filings['OCCUPATION'].nunique()} occupations\n"
    )

    question = (
        "Which economic sector does the contributor work in? "
        "Employer: {EMPLOYER}. Occupation: {OCCUPATION}."
    )
    est = filings.llm.estimate(question, op="classify", labels=SECTORS, **opts)
    print("Before sending anything:")
    print(est, "\n")

    sectors = filings.llm.classify(question, SECTORS, out="sector", **opts)
    run = semframe.last_run()
    print("classify:")
    print(sectors[["NAME", "EMPLOYER", "OCCUPATION", "sector"]].to_string(max_colwidth=32))
    print("\nsector counts:")
    print(sectors["sector"].value_counts(dropna=False).to_string(), "\n")
    if run is not None:
        print(
            f"estimated {est.planned.cached_tokens:,} of {est.planned.input_tokens:,} input "
            f"tokens cached; the run: {run.cached_tokens:,} of {run.prompt_tokens:,} "
            f"(chat-template tokens included) in {run.wall_seconds:.1f} s"
        )
        print(run, "\n")

    records = filings.head(8).llm.extract(
        "From the filing of {NAME} (employer {EMPLOYER}, occupation {OCCUPATION}), "
        "is the contributor retired, and what is their job in one word?",
        {"retired": bool, "job": str},
        **opts,
    )
    print("extract:")
    print(records[["NAME", "OCCUPATION", "retired", "job"]].to_string(max_colwidth=32))
    print(semframe.last_run())


if __name__ == "__main__":
    main()
