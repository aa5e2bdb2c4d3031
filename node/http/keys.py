"""The application key under which node/http/api.py's make_app keeps the node (its port,
node/process/ports.py ApiHost). Its own module so that every HTTP module can read it without
importing the API module that imports them."""
from aiohttp import web

NODE = web.AppKey("node", object)
