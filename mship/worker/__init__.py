"""Generated from proto/ by `make proto`. Do not edit."""
