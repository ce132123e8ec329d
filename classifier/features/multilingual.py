"""Marker words of the lexicon groups in other languages than English (domain knowledge, not data).

`MULTILINGUAL[group][lang]` is a `|`-separated list of phrases that count towards the marker group
`group` of `classifier.features.lexicon` (the English words live there). Every language adds to the
*same* groups, so a count such as `words_math_words` means "math vocabulary" in any language and the
model learns one weight for it: the evidence is the domain word, not the language it is written in.

Phrases are normalised like request text (lower-cased, digits folded): one word, or two words (a
word bigram). A script written without spaces (Chinese, Japanese, Korean, Thai) has one "word" per
character (see `classifier.features.hashing`), so a two-character entry is a bigram and a longer one
counts through its character bigrams. Words that are as common in one domain's requests as in
another's ("find", "value", "how many" in information questions) are left out, or put in a neutral
group (`question`).

Languages: the 13 of the data (ar de es fr it ko nl pt ro ru vi zh and English in `lexicon`) plus
Japanese, which the data does not have but traffic does. A phrase may have at most three "words"
(two character bigrams): longer katakana and Hangul words are cut to a distinctive head, and Thai is
left out (its vowel and tone marks are characters of their own, so its character bigrams are shared
by too many words); Thai requests rely on the script-independent features (digits, operators, code
syntax).
"""

from __future__ import annotations

MULTILINGUAL: dict[str, dict[str, str]] = {
    "code_topic": {
        "de": "funktion|funktionen|programm|programmieren|programmiere|quellcode|skript|liste|listen|"
        "zeichenkette|zeichenketten|datei|dateien|variable|variablen|schleife|klasse|klassen|methode|"
        "methoden|rückgabewert|zurück|implementiere|implementieren|eingabe|ausgabe|wörterbuch|element|"
        "elemente|sortieren|sortiert|datenbank|abfrage|fehlermeldung|bibliothek|modul|spalte|spalten|"
        "parameter|rekursiv|algorithmus|ganzzahl|ganzzahlen|zeichen|tupel|schlüssel|verzeichnis|"
        "ordner|array|arrays|objekt|objekte|typ|zeile|zeilen",
        "es": "función|funciones|programa|programar|código|script|lista|listas|cadena|cadenas|arreglo|"
        "diccionario|diccionarios|archivo|archivos|fichero|variable|variables|bucle|ciclo|clase|clases|"
        "método|métodos|devuelve|retorna|retornar|devolver|implementar|implementa|implemente|elemento|"
        "elementos|índice|índices|ordenar|columna|columnas|fila|filas|dataframe|consulta|biblioteca|"
        "librería|módulo|parámetro|parámetros|recursivo|recursiva|algoritmo|carácter|caracteres|tupla|"
        "tuplas|clave|claves|directorio|carpeta|ruta|imprimir|convertir|eliminar|reemplazar|"
        "expresión regular|objeto|objetos|tipo|línea|líneas|en python|con python",
        "fr": "fonction|fonctions|programme|programmer|code|script|liste|listes|chaîne|chaînes|tableau|"
        "dictionnaire|fichier|fichiers|variable|variables|boucle|classe|classes|méthode|méthodes|renvoie|"
        "retourne|renvoyer|retourner|implémenter|implémentez|élément|éléments|indice|index|trier|colonne|"
        "colonnes|ligne|lignes|caractère|caractères|paramètre|paramètres|algorithme|récursif|récursive|"
        "bibliothèque|module|requête|tuple|clé|clés|répertoire|dossier|chemin|objet|objets|en python",
        "it": "funzione|funzioni|programma|programmare|codice|script|lista|liste|stringa|stringhe|array|"
        "dizionario|file|variabile|variabili|ciclo|classe|classi|metodo|metodi|restituisce|ritorna|"
        "restituire|implementare|implementa|elemento|elementi|indice|ordinare|colonna|colonne|riga|"
        "righe|carattere|caratteri|parametro|parametri|algoritmo|ricorsivo|ricorsiva|libreria|modulo|"
        "tupla|chiave|chiavi|cartella|percorso|oggetto|oggetti|in python",
        "pt": "função|funções|programa|programar|código|script|lista|listas|string|strings|vetor|array|"
        "dicionário|arquivo|arquivos|variável|variáveis|laço|loop|classe|classes|método|métodos|retorna|"
        "retornar|devolve|implementar|implemente|elemento|elementos|índice|ordenar|coluna|colunas|linha|"
        "linhas|caractere|caracteres|parâmetro|parâmetros|algoritmo|recursivo|recursiva|biblioteca|"
        "módulo|tupla|chave|chaves|diretório|pasta|caminho|objeto|objetos|em python",
        "nl": "functie|functies|programma|programmeren|code|script|lijst|lijsten|tekenreeks|string|strings|"
        "array|woordenboek|bestand|bestanden|variabele|variabelen|lus|klasse|klassen|methode|methoden|"
        "retourneert|retourneer|implementeer|implementeren|element|elementen|index|sorteer|sorteren|"
        "kolom|kolommen|regel|regels|teken|tekens|parameter|parameters|algoritme|recursief|bibliotheek|"
        "module|tupel|sleutel|sleutels|map|pad|object|objecten|in python",
        "ro": "funcție|funcția|funcţie|funcţia|funcții|program|programul|programare|cod|codul|script|listă|"
        "lista|listei|șir|șirul|şir|şirul|tablou|dicționar|dicţionar|fișier|fişier|fișierul|variabilă|"
        "variabile|buclă|clasă|clasa|metodă|metoda|returnează|implementează|implementați|element|"
        "elemente|elementele|index|sortare|sortează|coloană|coloane|caracter|caractere|parametru|"
        "parametri|algoritm|recursiv|bibliotecă|modul|obiect|în python",
        "ru": "функция|функцию|функции|функций|функцией|программа|программу|программы|программе|"
        "программирование|код|кода|коде|коду|скрипт|скрипта|скрипте|список|списка|списке|списков|списком|"
        "списки|строка|строку|строки|строке|строк|строкой|строками|словарь|словаря|словаре|словари|"
        "словарей|массив|массива|массиве|массивы|массивов|файл|файла|файле|файлы|файлов|переменная|"
        "переменную|переменной|переменные|цикл|цикле|циклом|класс|класса|классе|метод|метода|методом|"
        "возвращает|вернуть|возвращающую|реализовать|реализуйте|реализация|элемент|элемента|элементы|"
        "элементов|элементам|индекс|индекса|индексу|отсортировать|сортировать|сортировка|столбец|столбца|"
        "столбцы|столбцов|колонку|колонки|колонок|символ|символа|символы|символов|параметр|параметры|"
        "алгоритм|рекурсивно|библиотека|библиотеки|модуль|модуля|запрос|кортеж|кортежа|кортежи|кортежей|"
        "ключ|ключа|ключи|ключу|ключам|питон|питоне|питона|питоном|датафрейм|датафрейма|директории|"
        "директорию|папку|папки|путь|юникод|байт|байты|удалить|заменить|преобразовать|вывести|объект|"
        "объекта|тип|типа|на python",
        "zh": "代码|编程|程序|字符|符串|列表|数组|字典|变量|编写|实现|返回|输入|输出|循环|对象|元素|索引|排序|"
        "文件|参数|递归|算法|脚本|调用|布尔|模块|报错|调试|接口|数据库|类型|键值|遍历|python",
        "ja": "関数|配列|変数|文字列|実装|辞書|出力|入力|戻り値|コード|クラス|引数|要素|python",
        "ko": "함수|코드|프로그|리스트|문자열|배열|변수|구현|반환|입력|출력|딕셔|파일|클래스|메서드|"
        "정렬|알고리|파이썬|스크립|요소|인덱스|객체|반복문|매개변|재귀",
        "vi": "hàm|chương trình|lập trình|mã|danh sách|chuỗi|mảng|từ điển|biến|vòng lặp|lớp|phương thức|"
        "trả về|triển khai|phần tử|chỉ số|sắp xếp|tệp|tập tin|tham số|thuật toán|đệ quy|ký tự|kí tự|"
        "đối tượng|kiểu|cài đặt",
        "ar": "دالة|الدالة|دالّة|دوال|برنامج|البرنامج|برمجة|كود|الكود|شفرة|قائمة|القائمة|سلسلة|السلسلة|مصفوفة|"
        "المصفوفة|قاموس|القاموس|ملف|الملف|متغير|المتغير|حلقة|فئة|الفئة|إرجاع|ترجع|يرجع|أرجع|تنفيذ|عنصر|"
        "العنصر|عناصر|العناصر|فهرس|ترتيب|عمود|أحرف|الأحرف|حرف|معامل|معلمة|خوارزمية|بايثون|سلاسل",
    },
    "math_words": {
        "de": "berechne|berechnen|berechnet|summe|differenz|produkt|wahrscheinlichkeit|gleichung|"
        "gleichungen|löse|fläche|flächeninhalt|umfang|radius|dreieck|winkel|kreis|quadrat|verhältnis|"
        "durchschnitt|durchschnittlich|gewinn|kosten|kostet|preis|euro|dollar|cent|insgesamt|jeweils|pro|"
        "mal|prozent|kilometer|meter|stunden|minuten|zahl|zahlen|teilbar|rest|bruch|verdient|verkauft|"
        "kauft|bezahlt|zahlt|übrig|wie viele|wie viel|wieviel|zusammen|kaufte|kaufen|verkaufte|verdiente|"
        "zahlte|gab|ausgegeben|liter|äpfel|dollar",
        "es": "calcula|calcular|calcule|suma|resta|diferencia|producto|probabilidad|ecuación|ecuaciones|"
        "resuelve|resolver|área|perímetro|triángulo|ángulo|círculo|cuadrado|promedio|ganancia|costo|cuesta|"
        "precio|dólares|dólar|centavos|euros|total|cada|veces|porcentaje|kilómetros|metros|horas|minutos|"
        "número|números|divisible|residuo|fracción|cuánto|cuánta|cuántos|cuántas|gana|vende|compra|paga|"
        "quedan|en total",
        "fr": "calculer|calculez|calcule|somme|différence|produit|probabilité|équation|équations|résoudre|"
        "résolvez|aire|périmètre|rayon|triangle|angle|cercle|carré|moyenne|bénéfice|coût|coûte|prix|"
        "dollars|euros|centimes|total|chaque|fois|pourcentage|kilomètres|mètres|heures|minutes|nombre|"
        "nombres|entier|divisible|reste|fraction|combien|gagne|vend|achète|paie|au total|en tout",
        "it": "calcola|calcolare|somma|differenza|prodotto|probabilità|equazione|equazioni|risolvi|area|"
        "perimetro|raggio|triangolo|angolo|cerchio|quadrato|media|guadagno|costo|costa|prezzo|dollari|"
        "euro|centesimi|totale|ogni|volte|percentuale|chilometri|metri|ore|minuti|numero|numeri|intero|"
        "divisibile|resto|frazione|quanti|quante|quanto|guadagna|vende|compra|paga|in totale",
        "pt": "calcule|calcular|soma|diferença|produto|probabilidade|equação|equações|resolva|resolver|área|"
        "perímetro|raio|triângulo|ângulo|círculo|quadrado|média|lucro|custo|custa|preço|dólares|reais|"
        "centavos|total|cada|vezes|porcentagem|quilômetros|metros|horas|minutos|número|números|inteiro|"
        "divisível|resto|fração|quantos|quantas|quanto|ganha|vende|compra|paga|no total|ao todo",
        "nl": "bereken|berekenen|som|verschil|product|kans|vergelijking|oppervlakte|omtrek|straal|driehoek|"
        "hoek|cirkel|vierkant|verhouding|gemiddelde|winst|kosten|kost|prijs|dollar|euro|cent|totaal|elke|"
        "per|keer|procent|kilometer|meter|uur|minuten|getal|getallen|deelbaar|rest|breuk|hoeveel|verdient|"
        "verkoopt|koopt|betaalt|in totaal",
        "ro": "calculați|calculaţi|calculează|suma|diferența|produsul|probabilitatea|ecuația|ecuaţia|"
        "rezolvați|aria|perimetrul|raza|triunghi|triunghiul|unghi|cerc|pătrat|media|profit|cost|costă|preț|"
        "dolari|lei|total|fiecare|ori|procent|kilometri|metri|ore|minute|număr|numere|numărul|divizibil|"
        "rest|fracție|câți|câte|cât|în total",
        "ru": "вычислите|вычислить|вычисли|посчитайте|посчитать|сумма|сумму|суммы|разность|произведение|"
        "вероятность|уравнение|уравнения|решите|решить|площадь|периметр|радиус|треугольник|треугольника|"
        "угол|окружность|круг|квадрат|среднее|прибыль|стоит|стоимость|цена|доллар|долларов|доллара|цент|"
        "центов|рублей|всего|каждый|каждого|каждую|каждой|раза|процент|процентов|км|метров|часов|часа|"
        "минут|число|числа|чисел|делится|остаток|дробь|сколько|зарабатывает|продает|продаёт|покупает|"
        "платит|осталось|останется|в сумме|купил|купила|купили|продал|продала|продали|заработал|"
        "заработала|потратил|потратила|потратили|заплатил|заплатила|отдал|отдала|съел|съела|получил|"
        "получила|стоил|стоила|стоят|яблок|яблока|конфет|рублей|рубля|долларах|метра|литров|литра",
        "zh": "计算|求解|求出|多少|几个|一共|总共|平均|面积|周长|半径|直径|三角形|方程|概率|百分|分数|整数|余数|"
        "每个|每天|每人|价格|利润|折扣|公里|分钟|小时|等于|已知|实数|集合|不等式|数列|倍|"
        "最小值|最大值|取值|范围",
        "ja": "計算|合計|全部で|何個|何人|何枚|何円|いくつ|いくら|平均|面積|確率|方程式|半分|割引|時速|"
        "円|個|匹|枚",
        "ko": "계산|합계|몇|평균|넓이|둘레|확률|방정식|반지름|삼각형|퍼센트|모두|각각|시간|킬로미|달러",
        "vi": "tính|tổng|hiệu|tích|xác suất|phương trình|giải|diện tích|chu vi|bán kính|tam giác|góc|"
        "hình tròn|hình vuông|tỉ lệ|tỷ lệ|trung bình|lợi nhuận|giá|đô la|đồng|mỗi|lần|phần trăm|giờ|phút|"
        "số nguyên|chia hết|số dư|phân số|bao nhiêu|mấy|tất cả",
        "ar": "احسب|مجموع|المجموع|الفرق|حاصل|ضرب|احتمال|الاحتمال|معادلة|المعادلة|مساحة|المساحة|محيط|"
        "مثلث|زاوية|دائرة|مربع|نسبة|متوسط|ربح|تكلفة|سعر|السعر|دولار|دولارات|سنتات|كل|مرات|بالمئة|"
        "كيلومتر|متر|ساعات|دقائق|قسمة|باقي|كسر|كم",
    },
    "number_words": {
        "de": "zwei|drei|vier|fünf|sechs|zehn|zwölf|zwanzig|hundert|tausend|hälfte|halb|doppelt|dutzend|"
        "dreimal|zweimal|viertel|drittel",
        "es": "dos|tres|cuatro|cinco|seis|diez|doce|veinte|cien|mil|mitad|doble|docena|triple|tercio|cuarto",
        "fr": "deux|trois|quatre|cinq|six|dix|douze|vingt|cent|mille|moitié|double|douzaine|triple|tiers|"
        "quart",
        "it": "due|tre|quattro|cinque|sei|dieci|dodici|venti|cento|mille|metà|doppio|dozzina|triplo|terzo",
        "pt": "dois|duas|três|quatro|cinco|seis|dez|doze|vinte|cem|mil|metade|dobro|dúzia|triplo|terço",
        "nl": "twee|drie|vier|vijf|zes|tien|twaalf|twintig|honderd|duizend|helft|dubbel|dozijn|derde|kwart",
        "ro": "doi|două|trei|patru|cinci|șase|zece|douăzeci|sută|mie|jumătate|dublu|triplu|sfert",
        "ru": "два|две|три|четыре|пять|шесть|десять|двадцать|сто|тысяча|половина|половину|вдвое|втрое|"
        "дюжина|треть|четверть|дважды|трижды",
        "zh": "一半|两倍|三倍|一倍|百分之|千克|万元",
        "ja": "半分|二倍|三倍|倍",
        "ko": "다섯|절반|두배|세배",
        "vi": "bốn|mười|trăm|nghìn|ngàn|nửa|gấp đôi|gấp ba",
        "ar": "اثنان|اثنين|ثلاثة|أربعة|خمسة|عشرة|مائة|مئة|ألف|نصف|ضعف|ربع|ثلث",
    },
    "chat_words": {
        "de": "aufsatz|gedicht|geschichte|brief|blog|artikel|lied|witz|erkläre|erklären|beschreibe|"
        "diskutiere|meinung|rat|tipps|zusammenfassung|fasse|menschen|land|welt|leben|gesundheit|film|buch|"
        "musik|reise|essen|fühlen|denken|bitte|danke|berühmt|stadt|krieg|könig|jahrhundert|kaiser|"
        "regierung|kultur|stell dir|vorteile|nachteile",
        "es": "ensayo|poema|historia|cuento|carta|correo|artículo|canción|chiste|explica|explique|describe|"
        "describa|opinión|consejo|consejos|resumen|resume|gente|país|mundo|vida|salud|película|libro|música|"
        "viaje|comida|favor|gracias|famoso|ciudad|guerra|rey|siglo|gobierno|cultura|imagina|ventajas",
        "fr": "essai|poème|histoire|récit|lettre|courriel|article|chanson|blague|explique|expliquez|décris|"
        "décrivez|opinion|conseil|conseils|résumé|résumez|gens|pays|monde|vie|santé|film|livre|musique|"
        "voyage|nourriture|merci|célèbre|ville|guerre|roi|siècle|gouvernement|culture|imaginez|avantages",
        "it": "saggio|poesia|storia|racconto|lettera|articolo|canzone|barzelletta|spiega|descrivi|opinione|"
        "consiglio|consigli|riassunto|riassumi|gente|paese|mondo|vita|salute|film|libro|musica|viaggio|cibo|"
        "grazie|famoso|città|guerra|re|secolo|governo|cultura|immagina|vantaggi",
        "pt": "ensaio|poema|história|conto|carta|artigo|canção|piada|explique|descreva|opinião|conselho|"
        "conselhos|resumo|resuma|pessoas|país|mundo|vida|saúde|filme|livro|música|viagem|comida|obrigado|"
        "famoso|cidade|guerra|rei|século|governo|cultura|imagine|vantagens",
        "nl": "essay|gedicht|verhaal|brief|artikel|lied|grap|leg uit|beschrijf|mening|advies|tips|"
        "samenvatting|mensen|land|wereld|leven|gezondheid|film|boek|muziek|reis|eten|dank|beroemd|stad|"
        "oorlog|koning|eeuw|regering|cultuur|stel je|voordelen",
        "ro": "eseu|poezie|poveste|istorie|istoria|scrisoare|articol|cântec|glumă|explică|descrie|opinie|"
        "sfat|sfaturi|rezumat|oameni|oamenii|țară|ţară|lume|lumii|viață|viaţă|sănătate|film|carte|muzică|"
        "călătorie|mâncare|mulțumesc|celebru|oraș|oraşul|orașul|război|rege|regele|secol|secolul|guvern|"
        "guvernul|cultură|parlamentul|parlament",
        "ru": "эссе|стихотворение|стих|стихи|историю|история|истории|рассказ|письмо|статью|статья|песню|"
        "песня|шутку|объясните|объясни|опишите|опиши|мнение|совет|советы|кратко|люди|страна|страны|мир|"
        "жизнь|здоровье|фильм|книга|книгу|музыка|путешествие|еда|пожалуйста|спасибо|известный|город|войны|"
        "война|король|век|века|правительство|культура|представьте|преимущества",
        "zh": "文章|诗歌|故事|历史|文化|为什么|国家|城市|人们|感觉|建议|解释|介绍|描述|朝代|皇帝|战争|世纪|作者|"
        "小说|阅读|材料|文言|诗人|句子|词语|成语|作品|思想|社会|政治|经济|发展|政府|民族|人物|写作|信",
        "ja": "作文|物語|手紙|歴史|文化|なぜ|説明|紹介|映画|音楽|旅行|料理|有名|戦争|世紀|社会|政治|経済|"
        "小説|人々|気持ち",
        "ko": "에세이|이야기|편지|역사|문화|왜|누구|어디|언제|국가|나라|도시|사람|사람들|느낌|설명|소개|영화|"
        "음악|여행|음식|유명|전쟁|세기|사회|정치|경제|소설|조언",
        "vi": "bài luận|bài thơ|câu chuyện|lá thư|lịch sử|văn hóa|văn hoá|tại sao|vì sao|quốc gia|đất nước|"
        "thế giới|cuộc sống|sức khỏe|phim|sách|âm nhạc|du lịch|món ăn|nổi tiếng|thành phố|chiến tranh|vua|"
        "thế kỷ|chính phủ|người dân|giải thích|mô tả|lời khuyên",
        "ar": "اكتب|مقال|مقالة|قصيدة|قصة|رسالة|تاريخ|التاريخ|ثقافة|الثقافة|لماذا|متى|أين|ماذا|الناس|دولة|"
        "الدولة|بلد|العالم|حياة|الحياة|الصحة|فيلم|كتاب|موسيقى|سفر|طعام|شكرا|مشهور|مدينة|المدينة|حرب|الحرب|"
        "ملك|الملك|قرن|القرن|الحكومة|اشرح|صف|نصيحة",
    },
    "pronouns": {
        "de": "ich|du|wir|ihr|mein|meine|dein|deine|mich|dich|uns|euch|mir|dir",
        "es": "yo|tú|nosotros|mi|mis|tu|tus|me|te|nos|usted",
        "fr": "je|tu|nous|vous|mon|ma|mes|ton|ta|tes|votre|vos|notre|moi|toi",
        "it": "io|tu|noi|voi|mio|mia|miei|tuo|tua|mi|ti|ci|lei",
        "pt": "eu|você|nós|meu|minha|meus|seu|sua|me|te|nos",
        "nl": "ik|jij|je|wij|we|jullie|mijn|jouw|uw|me|mij|ons",
        "ro": "eu|tu|noi|voi|meu|mea|tău|ta|mă|te|ne|dumneavoastră",
        "ru": "я|ты|мы|вы|мой|моя|мои|твой|ваш|ваша|меня|мне|тебя|тебе|нас|вам",
        "zh": "我|你|您|我们|你们",
        "ja": "私|僕|あなた|わたし|俺",
        "ko": "우리|당신|제가|내가|저는|나는",
        "vi": "tôi|bạn|chúng tôi|mình|anh|chị|em",
        "ar": "أنا|أنت|نحن|أنتم",
    },
    "stopwords": {
        "de": "der|die|das|und|ist|in|zu|den|von|mit|sich|des|auf|für|ein|eine|nicht|es|dem|im",
        "es": "de|la|que|el|en|y|a|los|se|del|las|un|por|con|no|una|su|para|es|al",
        "fr": "de|la|le|et|les|des|en|un|du|une|que|est|pour|qui|dans|au|sur|ne|pas|par",
        "it": "di|e|il|la|che|in|un|per|è|del|non|una|con|sono|si|da|dei|al|le|della",
        "pt": "de|a|o|que|e|do|da|em|um|para|é|com|não|uma|os|no|se|na|por|das",
        "nl": "de|het|een|en|van|in|is|dat|op|te|zijn|met|voor|niet|aan|er|die|ook",
        "ro": "și|şi|de|la|în|a|cu|pe|un|o|care|nu|din|că|se|pentru|este|fost|al|lui",
        "ru": "и|в|не|на|что|с|по|как|к|из|у|за|от|это|о|для|же|бы|был|его",
        "zh": "的|了|是|在|和|有|不|这|也|就|都|他|她|它|着|与",
        "ja": "の|に|は|を|た|が|で|て|と|し|れ|さ|な|も|か|です|ます",
        "ko": "은|는|이|가|을|를|에|의|와|과|도|으로|에서",
        "vi": "và|của|là|có|được|cho|không|những|một|các|trong|với|để|này|đã",
        "ar": "في|من|على|إلى|أن|هذا|هذه|التي|الذي|عن|مع|كان|هو|هي|و",
    },
    "question": {
        "de": "wer|was|wie|wo|wann|warum|welche|welcher|welches|wem|wen|wozu|weshalb",
        "es": "qué|cómo|dónde|cuándo|por qué|quién|quiénes|cuál|cuáles",
        "fr": "que|quoi|comment|où|quand|pourquoi|qui|quel|quelle|quels|quelles|lequel|laquelle",
        "it": "che|cosa|come|dove|quando|perché|chi|quale|quali",
        "pt": "que|como|onde|quando|por que|porque|quem|qual|quais",
        "nl": "wat|hoe|waar|wanneer|waarom|wie|welke|welk",
        "ro": "ce|cum|unde|când|de ce|cine|care|cărui|căror",
        "ru": "что|как|где|когда|почему|зачем|кто|какой|какая|какие|каком|какое|каких|чем|чего",
        "zh": "什么|怎么|如何|哪里|哪个|哪些|为何|何时|谁|吗|呢",
        "ja": "何|なぜ|どこ|いつ|誰|どう|どの|どれ|ですか|ますか",
        "ko": "무엇|어떻게|어디|언제|왜|누가|누구|어떤|무슨",
        "vi": "gì|thế nào|như thế nào|đâu|khi nào|tại sao|ai|nào|sao",
        "ar": "ما|ماذا|كيف|أين|متى|لماذا|من|أي|ماهو|هل",
    },
    "code_request": {
        "de": "eine funktion|ein programm|ein skript|den code|in python|in java|python funktion",
        "es": "una función|un programa|un script|el código|en python|en java|en javascript",
        "fr": "une fonction|un programme|un script|le code|en python|en java|en javascript",
        "it": "una funzione|un programma|uno script|il codice|in python|in java",
        "pt": "uma função|um programa|um script|o código|em python|em java",
        "nl": "een functie|een programma|een script|de code|in python",
        "ro": "o funcție|o funcţie|un program|un script|codul|în python",
        "ru": "на python|на питоне|на питон|функцию которая|напишите функцию|напишите программу|"
        "напишите код|написать функцию|написать программу",
        "zh": "编写|用python|python代码|写代码|段代码",
        "ja": "関数を|pythonで|コード",
        "ko": "함수를|코드를|파이썬",
        "vi": "viết hàm|một hàm|viết chương trình|bằng python|đoạn mã",
        "ar": "اكتب دالة|دالة تأخذ|بلغة بايثون|باستخدام بايثون",
    },
    "math_phrases": {
        "de": "wie viele|wie viel|wie lange|wie weit|wie alt|den wert|die summe|die anzahl|pro stunde|"
        "pro tag|jeden tag|die fläche|den umfang|mehr als|weniger als",
        "es": "cuántos|cuántas|cuánto|el valor|la suma|el número de|por hora|por día|cada día|el área|"
        "más que|menos que|cuánto tiempo|cuántos años",
        "fr": "combien|la valeur|la somme|le nombre de|par heure|par jour|chaque jour|l'aire|de plus que|"
        "de moins que|combien de",
        "it": "quanti|quante|quanto|il valore|la somma|il numero di|all'ora|al giorno|ogni giorno|l'area|"
        "più di|meno di",
        "pt": "quantos|quantas|quanto|o valor|a soma|o número de|por hora|por dia|cada dia|a área|mais que|"
        "menos que",
        "nl": "hoeveel|de waarde|de som|het aantal|per uur|per dag|elke dag|de oppervlakte|meer dan|minder dan",
        "ro": "câți|câte|cât|valoarea|suma|numărul de|pe oră|pe zi|în fiecare|aria|mai mult|mai puțin",
        "ru": "сколько|значение|сумму|количество|в час|в день|каждый день|площадь|больше чем|меньше чем|"
        "на сколько|во сколько",
        "zh": "多少|几个|多少钱|多少个|多少天|的值|之和|的和|个数|每小时|每天|面积|多几|少几",
        "ja": "いくつ|何個|何人|いくら|何円|何分|何時間|合計で",
        "ko": "몇 개|몇 명|몇 분|얼마|얼마나|모두 몇|합은|값은",
        "vi": "bao nhiêu|mấy|giá trị|tổng của|số lượng|mỗi giờ|mỗi ngày|diện tích",
        "ar": "كم عدد|كم|قيمة|مجموع|عدد|في الساعة|في اليوم|كل يوم|مساحة",
    },
    "chat_request": {
        "de": "ein gedicht|einen aufsatz|eine geschichte|einen brief|eine e-mail|einen blog|einen artikel|"
        "ein lied|eine rede|eine zusammenfassung|mindestens",
        "es": "un poema|un ensayo|una historia|una carta|un correo|un artículo|una canción|un discurso|"
        "un resumen|al menos",
        "fr": "un poème|un essai|une histoire|une lettre|un courriel|un article|une chanson|un discours|"
        "un résumé|au moins",
        "it": "una poesia|un saggio|una storia|una lettera|un articolo|una canzone|un discorso|un riassunto|"
        "almeno",
        "pt": "um poema|um ensaio|uma história|uma carta|um artigo|uma canção|um discurso|um resumo|pelo menos",
        "nl": "een gedicht|een essay|een verhaal|een brief|een artikel|een lied|een toespraak|"
        "een samenvatting|ten minste",
        "ro": "o poezie|un eseu|o poveste|o scrisoare|un articol|un cântec|un discurs|un rezumat|cel puțin",
        "ru": "стихотворение о|эссе о|рассказ о|письмо|статью о|песню о|речь|не менее|как минимум",
        "zh": "一首诗|篇文章|个故事|一封信|至少",
        "ja": "詩を|物語を|手紙を|作文を",
        "ko": "시를|편지를|적어도",
        "vi": "một bài|bài thơ|câu chuyện|lá thư|ít nhất",
        "ar": "قصيدة عن|مقالا عن|قصة عن|رسالة إلى|على الأقل",
    },
}
