"""The OpenAI-compatible paths the router forwards and the runtime admits."""

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
RESPONSES_PATH = "/v1/responses"
MODELS_PATH = "/v1/models"
