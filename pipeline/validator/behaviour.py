"""An observable behavioural change.

``expected_effect.behavioral_change`` must say what should first be *seen* in a trajectory
(an actor doing or no longer doing something), not a wish about outcomes ("quality is
higher", "更稳定"). Deterministic test: the text must contain at least one action word from
a fixed list (English or Chinese); outcome words alone do not count.
"""

from __future__ import annotations

import re

from pipeline.validator.findings import TextField

RULES: dict[str, str] = {"V-BEHAVIOR-UNOBSERVABLE": "behavioral_change names no observable action"}

_ACTION = re.compile(
    r"(?i)\b(?:enters?|entering|skips?|skipped|creates?|created|writes?|wrote|written|calls?|called|invokes?|routes?|routed|"
    r"returns?|returned|hands? (?:back|off|over)|hands?|stops?|stopped|ends?|ended|terminates?|terminated|halts?|"
    r"re-?runs?|re-?enters?|re-?reviews?|retries|retried|accepts?|accepted|rejects?|rejected|asks?|asked|requests?|"
    r"requested|reads?|opens?|marks?|marked|records?|recorded|emits?|emitted|moves?|moved|proceeds?|goes|sends?|sent|"
    r"submits?|submitted|edits?|edited|modifies|modified|changes? (?:the|its)|checks?|reviews?|passes|blocks?|blocked|"
    r"waits?|transitions?|invalidates?|invalidated|confirms?|confirmed|escalates?|repairs?|fixes|produces?|runs? the|"
    r"no longer|instead of|next step|first action|before|after|once)\b|"
    r"进入|跳过|创建|写入|写|调用|路由|返回|交还|回退|停止|终止|结束|重跑|重新|确认|拒绝|接受|accept|提交|请求|读取|修改|"
    r"标记|失效|转入|转交|移交|发出|记录|出现|不再|下一步|之后|而不是|改为|检查|复审|询问|等待|阻止|执行|生成|触发|退回|交给"
)


def check_behaviour(fields: list[TextField]) -> list[tuple[str, str, str]]:
    """Return (rule, path, message) when behavioral_change names no observable action."""
    out: list[tuple[str, str, str]] = []
    for f in fields:
        if f.path.endswith(".expected_effect.behavioral_change") and not _ACTION.search(f.text):
            out.append(
                (
                    "V-BEHAVIOR-UNOBSERVABLE",
                    f.path,
                    "names no action an observer could see in a trajectory (who does or stops doing what, when); "
                    "outcome wishes such as 'higher quality' are not a behavioural prediction",
                )
            )
    return out
