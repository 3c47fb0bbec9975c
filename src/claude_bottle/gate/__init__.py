"""The gate: holds the credential, serves the API route and the egress proxy, audits every decision."""
