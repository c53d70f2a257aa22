"""`ascent studio`: a web UI over a directory of runs (design.md, package map: `studio/`).

It reads what runs write (metrics.jsonl, status.json, trace.json, config.yaml, experience.db) and never
writes into a run; the only file it writes is a config the user saves from the editor. `app` is the
FastAPI app (API + the static page in `static/`), `server` binds and runs it. Imports: `tracking` and
`config` only, as design.md says (and `errors`): the experience store, status.json and the run-dir lock are
read with the readers `tracking` keeps next to their formats (`experience_store`, `status`, `runlock`), the
same ones the writers use, so the studio depends on no higher layer and stays free of torch.
"""

from ascent.studio.app import create_app
from ascent.studio.server import StudioServer

__all__ = ["StudioServer", "create_app"]
