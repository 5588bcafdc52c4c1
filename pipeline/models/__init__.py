"""Model layer: prompts, one async client (live / record / replay), recording store, call log, estimates.

Public API (other stages import only these names)::

    from pipeline.models import ModelClient, CallOutcome, render, PlannedCall, estimate
    client = ModelClient(settings, run_dir, log=ctx.log)
    out = await client.call(role="luna", cell_id="C004", context={...}, response_model=Patterns, check=fn)
    results = await client.gather([client.call(...) for ...], label="luna")

Heavy libraries (litellm, instructor) are imported inside functions, so importing this
package stays cheap and never touches the network.
"""

from pipeline.models.accounting import Usage
from pipeline.models.calllog import CallLog, format_summary, read_calls, summarise
from pipeline.models.client import CallOutcome, ModelClient
from pipeline.models.errors import BudgetExceeded, ModelUnavailable, PromptError, ReplayMiss
from pipeline.models.estimate import Estimate, PlannedCall, estimate, format_estimate
from pipeline.models.progress import gather_bounded
from pipeline.models.prompts import ROLES, RenderedPrompt, prompts_dir, render, template_hash, template_hashes
from pipeline.models.store import RecordingStore, canonical_request, request_key, resolve_settings

__all__ = [
    "ROLES",
    "BudgetExceeded",
    "CallLog",
    "CallOutcome",
    "Estimate",
    "ModelClient",
    "ModelUnavailable",
    "PlannedCall",
    "PromptError",
    "RecordingStore",
    "RenderedPrompt",
    "ReplayMiss",
    "Usage",
    "canonical_request",
    "estimate",
    "format_estimate",
    "format_summary",
    "gather_bounded",
    "prompts_dir",
    "read_calls",
    "render",
    "request_key",
    "resolve_settings",
    "summarise",
    "template_hash",
    "template_hashes",
]
