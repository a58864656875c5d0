"""The Responses and Conversations APIs (/v1/responses, /v1/conversations)."""
