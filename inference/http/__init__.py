"""The HTTP layer: the /v1 decorator (auth, limits, error shapes), the ASGI guard and middleware, CORS,
request ids and records, the OpenAI views and the surfaces they share with the batch runner."""
