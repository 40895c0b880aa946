

decode-abcKVUX€€€€€à€€@key €*  *f160ï›¯…‰Ï•š8Btiny2ucx