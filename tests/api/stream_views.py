"""A test-only generating endpoint: it holds a rate-limit lease while streaming SSE chunks, the
way the chat view does, without the engine; openai_endpoint settles the lease with the tokens
the view reports used. Registered only by tests (stream_urls.py)."""
import asyncio
import json

from django.http import JsonResponse, StreamingHttpResponse

from inference.http.api import admit, openai_endpoint

# Tests open a gate (an asyncio.Event) by name to let a held stream finish.
gates: dict[str, asyncio.Event] = {}


@openai_endpoint(generates=True)
async def fake_stream(request):
    """GET ?prompt=P&max_tokens=M&chunks=N[&gate=NAME]: reserve P + M tokens, send N chunks (one
    "token" each), then wait for the gate (if named), then [DONE]; charge P + chunks sent."""
    prompt = int(request.GET["prompt"])
    max_tokens = int(request.GET["max_tokens"])
    chunks = int(request.GET["chunks"])
    gate = request.GET.get("gate")
    generated = 0
    await admit(request, reserve_tokens=prompt + max_tokens, used_tokens=lambda: prompt + generated)

    async def events():
        nonlocal generated
        for i in range(chunks):
            generated += 1
            yield f"data: {json.dumps({'token': i})}\n\n"
        if gate:
            await gates[gate].wait()
        yield "data: [DONE]\n\n"

    return StreamingHttpResponse(events(), content_type="text/event-stream")



@openai_endpoint(generates=True)
async def forgetful(request):
    """GET ?reserve=N[&stream=1]: admit N tokens, report all N used, and answer (in JSON, or as a
    one-chunk stream) without settling anything itself: the wrapper must."""
    reserve = int(request.GET["reserve"])
    await admit(request, reserve_tokens=reserve, used_tokens=lambda: reserve)
    if request.GET.get("stream"):
        async def events():
            yield "data: [DONE]\n\n"
        return StreamingHttpResponse(events(), content_type="text/event-stream")
    return JsonResponse({"ok": True})
