"""Agent chat: a ReAct loop over an OpenAI-compatible model, with sandbox tools,
workspace context, human approval, and runs whose SSE event logs survive reconnects."""
