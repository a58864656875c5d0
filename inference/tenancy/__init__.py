"""Who is calling and how much they may: API keys, authentication, rate limits."""
