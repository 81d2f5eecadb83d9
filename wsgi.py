from service import create_app

app = create_app()
