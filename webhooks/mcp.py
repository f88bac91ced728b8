"""MCP-managed webhook subscriptions (the Events extension's webhook mode)."""
ITEM = "org.switchboard/inbox.item"
PENDING = "org.switchboard/inbox.pending"
WORK = "spaces.work.available"

class CallbackFailed(Exception):
    def __init__(self, reason): self.reason = reason
