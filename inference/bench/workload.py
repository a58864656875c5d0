"""A ShareGPT-like synthetic workload: mixed prompt and output lengths from a fixed seed."""
from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have this from or had by "
         "word but what some we can out other were all there when up use your how said an each she which do their "
         "time if will way about many then them write would like so these her long make thing see him two has look "
         "more day could go come did number sound no most people my over know water than call first who may down "
         "side been now find any new work part take get place made live where after back little only round man year "
         "came show every good me give our under name very through just form sentence great think say help low line "
         "differ turn cause much mean before move right boy old too same tell does set three want air well also play "
         "small end put home read hand port large spell add even land here must big high such follow act why ask men "
         "change went light kind off need house picture try us again animal point mother world near build self earth "
         "father head stand own page should country found answer school grow study still learn plant cover food sun "
         "four between state keep eye never last let thought city tree cross farm hard start might story saw far sea "
         "draw left late run while press close night real life few north open seem together next white children "
         "begin got walk example ease paper group always music those both mark often letter until mile river car "
         "feet care second book carry took science eat room friend began idea fish mountain stop once base hear "
         "horse cut sure watch color face wood main enough plain girl usual young ready above ever red list though "
         "feel talk bird soon body dog family direct pose leave song measure door product black short numeral class "
         "wind question happen complete ship area half rock order fire south problem piece told knew pass since top "
         "whole king space heard best hour better true during hundred five remember step early hold west ground "
         "interest reach fast verb sing listen six table travel less morning ten simple several vowel toward war lay "
         "against pattern slow center love person money serve appear road map rain rule govern pull cold notice "
         "voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star box noun "
         "field rest correct able pound done beauty drive stood contain front teach week final gave green oh quick "
         "develop ocean warm free minute strong special mind behind clear tail produce fact street inch multiply "
         "nothing course stay wheel full force blue object decide surface deep moon island foot system busy test "
         "record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate hot "
         "miss brought heat snow tire bring yes distant fill east paint language among").split()


@dataclass(slots=True)
class BenchRequest:
    """One request: a user message of about `prompt_tokens` tokens and a fixed output length in tokens."""

    prompt: str
    prompt_tokens: int
    output_tokens: int


def make_text(tokenizer, n_tokens: int, rng: random.Random) -> str:
    """Random words until the text is n_tokens long under `tokenizer` (trimmed to fit)."""
    words = []
    while True:
        words.extend(rng.choice(WORDS) for _ in range(max(8, n_tokens // 2)))
        ids = tokenizer.encode(" ".join(words))
        if len(ids) >= n_tokens:
            return tokenizer.decode(ids[:n_tokens])


def sharegpt_like(tokenizer, n: int, seed: int = 0, prompt_range=(64, 512), output_range=(64, 256)) -> list[BenchRequest]:
    """n requests with prompt and output lengths drawn uniformly from the ranges (tokens)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = rng.randint(*prompt_range)
        out.append(BenchRequest(make_text(tokenizer, p, rng), p, rng.randint(*output_range)))
    return out
