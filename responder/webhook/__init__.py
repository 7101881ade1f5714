"""The Alertmanager webhook: deliveries validated (`alerts`), what one alert records (`intake`, pure), the
conditional writes of the records (`recorder`) and `POST /webhook` (`server`). Every replica serves it.
"""
