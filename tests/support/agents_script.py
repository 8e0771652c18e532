"""The scripted model's part in seed 002's sidebar scenarios (test support): the README's
curl example and the Node sidebar test. ``double_ages`` edits the ``data.json`` the run
was given (a list of users: every ``age`` doubled) with one ``bash`` call, then answers
``ANSWER``."""

from __future__ import annotations

from scripted_llm import Reply, text_reply, tool_reply, tool_results

EDIT = (
    "python3 -c \"import json; d = json.load(open('data.json')); "
    "[u.update(age=u['age'] * 2) for u in d]; json.dump(d, open('data.json', 'w')); "
    "print(len(d), 'users updated')\""
)
ANSWER = "Doubled every age."


def double_ages(body: dict) -> Reply:
    if not tool_results(body):
        return tool_reply("bash", {"command": EDIT}, call_id="call_edit")
    return text_reply(ANSWER)
