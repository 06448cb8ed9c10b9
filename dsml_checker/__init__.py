"""dsml_checker: decide whether a model's turn is clean or carries broken DeepSeek DSML tool-call markup."""
