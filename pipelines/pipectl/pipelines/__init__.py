"""Pipeline definitions (Hera) and the backends that run compiled workflows."""
