"""The operators' console pages: the front door (/), the playground (/playground) and the admin's live dashboard."""
