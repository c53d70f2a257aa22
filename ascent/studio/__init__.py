"""`ascent studio`: a web UI over a directory of runs (design.md, package map: `studio/`).

It reads what runs write (metrics.jsonl, status.json, trace.json, config.yaml, experience.db) and never
writes into a run; the only file it writes is a config the user saves from the editor. `app` is the
FastAPI app (API + the static page in `static/`), `server` binds and runs it. Imports: `tracking` and
`config` as design.md says, plus two read-side pieces owned elsewhere: the experience store's reader
(`ascent.transport.store`, the episode browser) and the run-dir lock probe (`ascent.orchestrator.rundir`,
telling a live run from a killed one); both import nothing but `errors` and `messages`, so the studio
stays free of torch.
"""

from ascent.studio.app import create_app
from ascent.studio.server import StudioServer

__all__ = ["StudioServer", "create_app"]
